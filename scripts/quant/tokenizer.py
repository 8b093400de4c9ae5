"""The tokenizer and chat template of a real GGUF, copied into a `gguf.GGUFWriter`: the
random-weight files (scripts/quant/random_*.py, scripts/make_quant_fixtures.py) take a
real model's so that the engine loads and chats with them; and the writer's write-out."""


def copy_tokenizer(w, fields, pre=None, extra_tokens=0):
    """Writes the tokenizer keys of `fields` (a `gguf.GGUFReader`'s) to `w`, the pre-tokenizer
    `pre` when given and `extra_tokens` unused tokens after the vocabulary (to reach a larger
    model's); no BOS is added."""
    c = lambda k: fields[k].contents()
    w.add_tokenizer_model(c("tokenizer.ggml.model"))
    w.add_tokenizer_pre(pre or c("tokenizer.ggml.pre"))
    w.add_token_list(list(c("tokenizer.ggml.tokens")) + [f"<|unused_{i}|>" for i in range(extra_tokens)])
    w.add_token_types(list(c("tokenizer.ggml.token_type")) + [4] * extra_tokens)
    w.add_token_merges(c("tokenizer.ggml.merges"))
    w.add_bos_token_id(c("tokenizer.ggml.bos_token_id"))
    w.add_eos_token_id(c("tokenizer.ggml.eos_token_id"))
    w.add_add_bos_token(False)
    w.add_chat_template(c("tokenizer.chat_template"))


def write(w):
    """Writes `w`'s header, keys and tensors, and closes it."""
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
