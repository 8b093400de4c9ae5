"""Drives `paradraft serve` with the official `openai` Python package.

Usage: openai_client.py BASE_URL EXPECTED_JSON (the server runs with --api-key sk-py; the
expected texts are `paradraft generate` outputs at temperature 0)."""

import json
import sys

import openai
from openai import OpenAI

base, want = sys.argv[1], json.loads(sys.argv[2])
client = OpenAI(base_url=base, api_key="sk-py", max_retries=0)

models = client.models.list()
model = models.data[0].id
assert len(models.data) == 1, models

# Chat, non-streaming.
r = client.chat.completions.create(
    model=model,
    messages=[{"role": "user", "content": "Name a color."}],
    max_tokens=20,
    temperature=0,
)
assert r.choices[0].message.content == want["chat"], (r, want["chat"])
assert r.choices[0].message.role == "assistant"
assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens
assert r.object == "chat.completion" and r.id.startswith("chatcmpl-")

# Chat, streaming with usage; max_completion_tokens and a stop string.
stream = client.chat.completions.create(
    model=model,
    messages=[{"role": "user", "content": "Count from 1 to 10, separated by commas."}],
    max_completion_tokens=40,
    temperature=0,
    stop=[","],
    stream=True,
    stream_options={"include_usage": True},
)
text, finish, usage, roles = "", None, None, []
for chunk in stream:
    if chunk.usage is not None:
        usage = chunk.usage
    for c in chunk.choices:
        if c.delta.role:
            roles.append(c.delta.role)
        text += c.delta.content or ""
        finish = c.finish_reason or finish
assert text == want["chat_stop"], (text, want["chat_stop"])
assert finish == "stop", finish
assert roles == ["assistant"], roles
assert usage is not None and usage.completion_tokens >= 1, usage

# Completions, non-streaming and streaming.
r = client.completions.create(
    model=model, prompt="The capital of Italy is", max_tokens=12, temperature=0
)
assert r.choices[0].text == want["completion"], (r, want["completion"])
assert r.usage.completion_tokens <= 12
parts = [
    c.choices[0].text
    for c in client.completions.create(
        model=model, prompt="The capital of Italy is", max_tokens=12, temperature=0, stream=True
    )
    if c.choices
]
assert "".join(parts) == want["completion"], parts

# Sampling with a seed is reproducible.
a, b = (
    client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": "Tell me a story."}],
        max_tokens=16,
        temperature=0.9,
        seed=42,
    ).choices[0].message.content
    for _ in range(2)
)
assert a == b, (a, b)

# min_p (llama-server's and vLLM's extension, served while speculating): min_p = 1 keeps only
# the most probable token, so a sampled request equals the greedy answer.
r = client.chat.completions.create(
    model=model,
    messages=[{"role": "user", "content": "Name a color."}],
    max_tokens=20,
    temperature=0.9,
    seed=7,
    extra_body={"min_p": 1.0},
)
assert r.choices[0].message.content == want["chat"], (r, want["chat"])

# Bias, penalties and log-probabilities (served while speculating, #61): the same text and
# log-probabilities as `paradraft generate` with the same settings, streaming or not.
pc = want["processed_chat"]
kw = dict(
    model=model,
    messages=[{"role": "user", "content": "Name three colors."}],
    max_tokens=24,
    temperature=0,
    presence_penalty=1,
    frequency_penalty=0.5,
    logit_bias={"2382": -100},
    logprobs=True,
    top_logprobs=3,
    extra_body={"repetition_penalty": 1.2},
)
r = client.chat.completions.create(**kw)
assert r.choices[0].message.content == pc["text"], (r, pc["text"])
lps = r.choices[0].logprobs.content
assert len(lps) == len(pc["logprobs"]) == r.usage.completion_tokens, (len(lps), r.usage)
for got, ref in zip(lps, pc["logprobs"]):
    assert abs(got.logprob - ref["logprob"]) < 1e-4, (got, ref)
    assert len(got.top_logprobs) == 3 and got.top_logprobs[0].logprob >= got.logprob - 1e-6, got
    assert [abs(t.logprob - l) < 1e-4 for t, (_, l) in zip(got.top_logprobs, ref["top"])] == [True] * 3
    assert bytes(got.bytes) == got.token.encode()
assert "".join(t.token for t in lps) == pc["text"], lps
text, streamed = "", []
for chunk in client.chat.completions.create(stream=True, **kw):
    for c in chunk.choices:
        text += c.delta.content or ""
        if c.logprobs and c.logprobs.content:
            streamed += c.logprobs.content
assert text == pc["text"], (text, pc["text"])
assert [t.logprob for t in streamed] == [t.logprob for t in lps], streamed

pcmp = want["processed_completion"]
ckw = dict(
    model=model,
    prompt="Name three colors.",
    max_tokens=24,
    temperature=0,
    presence_penalty=1,
    frequency_penalty=0.5,
    logit_bias={"2382": -100},
    logprobs=2,
    extra_body={"repetition_penalty": 1.2},
)
r = client.completions.create(**ckw)
lp = r.choices[0].logprobs
assert r.choices[0].text == pcmp["text"], (r, pcmp["text"])
assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.text_offset) == len(pcmp["logprobs"])
for got, ref in zip(lp.token_logprobs, pcmp["logprobs"]):
    assert abs(got - ref["logprob"]) < 1e-4, (got, ref)
assert all(len(t) in (2, 3) for t in lp.top_logprobs), lp.top_logprobs
assert lp.text_offset == sorted(lp.text_offset) and lp.text_offset[0] == 0, lp.text_offset
streamed = []
for c in client.completions.create(stream=True, **ckw):
    if c.choices and c.choices[0].logprobs:
        streamed += c.choices[0].logprobs.token_logprobs
assert streamed == lp.token_logprobs, (streamed, lp.token_logprobs)

# Structured output (#61): response_format json_schema equals `generate --json-schema` and
# validates; json_object parses; a Lark grammar (extension) is followed; streaming agrees.
import jsonschema

schema = want["schema"]
skw = dict(
    model=model,
    messages=[{"role": "user", "content": "Describe a cat as JSON."}],
    max_tokens=80,
    temperature=0,
    response_format={"type": "json_schema", "json_schema": {"name": "cat", "schema": schema, "strict": True}},
)
r = client.chat.completions.create(**skw)
out = r.choices[0].message.content
assert out == want["structured"], (out, want["structured"])
assert r.choices[0].finish_reason == "stop", r
jsonschema.validate(json.loads(out), schema)
text = "".join(
    c.choices[0].delta.content or ""
    for c in client.chat.completions.create(stream=True, **skw)
    if c.choices
)
assert text == out, (text, out)
for seed in range(3):
    r = client.chat.completions.create(**{**skw, "temperature": 1.0, "seed": seed})
    if r.choices[0].finish_reason == "stop":
        jsonschema.validate(json.loads(r.choices[0].message.content), schema)
r = client.chat.completions.create(
    model=model,
    messages=[{"role": "user", "content": "Give me some JSON."}],
    max_tokens=120,
    temperature=0,
    response_format={"type": "json_object"},
)
if r.choices[0].finish_reason == "stop":
    assert isinstance(json.loads(r.choices[0].message.content), dict), r
r = client.completions.create(
    model=model,
    prompt="Three colors:",
    max_tokens=30,
    temperature=0,
    extra_body={"grammar": 'start: " " c ", " c ", " c\nc: "red" | "green" | "blue" | "black"'},
)
words = r.choices[0].text.strip().split(", ")
assert len(words) == 3 and set(words) <= {"red", "green", "blue", "black"}, r
for bad in (
    {"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": 7}}}},
    {"response_format": {"type": "xml"}},
    {"response_format": {"type": "json_object"}, "extra_body": {"regex": "a+"}},
    {"extra_body": {"grammar": "start: ("}},
):
    try:
        extra = bad.pop("extra_body", None)
        client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": "x"}], extra_body=extra, **bad
        )
        raise AssertionError(f"{bad} {extra} accepted")
    except openai.BadRequestError as e:
        assert e.status_code == 400

# n choices (#61): each its own seed (seed, seed + 1, ...), the prompt computed once.
r = client.chat.completions.create(
    model=model, messages=[{"role": "user", "content": "Name a color."}], max_tokens=20,
    temperature=0, n=3,
)
assert [c.index for c in r.choices] == [0, 1, 2], r
assert all(c.message.content == want["chat"] for c in r.choices), r
one = lambda seed: client.chat.completions.create(
    model=model, messages=[{"role": "user", "content": "Tell me a story."}], max_tokens=16,
    temperature=0.9, seed=seed,
).choices[0].message.content
r = client.chat.completions.create(
    model=model, messages=[{"role": "user", "content": "Tell me a story."}], max_tokens=16,
    temperature=0.9, seed=42, n=2,
)
assert [c.message.content for c in r.choices] == [one(42), one(43)], r
texts, finishes = ["", ""], [None, None]
for chunk in client.chat.completions.create(
    model=model, messages=[{"role": "user", "content": "Tell me a story."}], max_tokens=16,
    temperature=0.9, seed=42, n=2, stream=True,
):
    for c in chunk.choices:
        texts[c.index] += c.delta.content or ""
        finishes[c.index] = c.finish_reason or finishes[c.index]
assert texts == [c.message.content for c in r.choices], (texts, r)
assert all(finishes), finishes
r = client.completions.create(
    model=model, prompt="The capital of Italy is", max_tokens=12, temperature=0, n=2, logprobs=1
)
assert [c.text for c in r.choices] == [want["completion"]] * 2, r
assert r.choices[0].logprobs.token_logprobs == r.choices[1].logprobs.token_logprobs

# Tools (#61): tool_choice required or named holds the reply to one call of an offered tool,
# read back as tool_calls whose arguments satisfy the tool's schema; streamed the same; equal
# with speculation off; auto answers or calls; a tool's result continues the conversation.
tools = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "The current weather in a city",
        "parameters": {"type": "object", "properties": {
            "city": {"type": "string"}, "unit": {"enum": ["celsius", "fahrenheit"]}},
            "required": ["city", "unit"], "additionalProperties": False}}},
    {"type": "function", "function": {
        "name": "add", "description": "Adds two integers",
        "parameters": {"type": "object", "properties": {
            "a": {"type": "integer"}, "b": {"type": "integer"}}, "required": ["a", "b"]}}},
]
spec = {t["function"]["name"]: t["function"]["parameters"] for t in tools}
question = {"role": "user", "content": "What is the weather in Paris?"}
tkw = dict(model=model, messages=[question], tools=tools, max_tokens=60, temperature=0)
plain = lambda calls: [(c.function.name, c.function.arguments) for c in calls]
for choice in ("required", {"type": "function", "function": {"name": "add"}}):
    r = client.chat.completions.create(tool_choice=choice, **tkw)
    c = r.choices[0]
    assert c.finish_reason == "tool_calls" and c.message.content is None, r
    calls = c.message.tool_calls
    assert len(calls) == 1 and calls[0].type == "function" and calls[0].id.startswith("call_"), r
    jsonschema.validate(json.loads(calls[0].function.arguments), spec[calls[0].function.name])
    if isinstance(choice, dict):
        assert calls[0].function.name == "add", r
    off = client.chat.completions.create(
        tool_choice=choice, extra_body={"speculative": {"enabled": False}}, **tkw
    )
    assert plain(off.choices[0].message.tool_calls) == plain(calls), (off, r)
    got, finish = {}, None
    for chunk in client.chat.completions.create(tool_choice=choice, stream=True, **tkw):
        for ch in chunk.choices:
            assert not ch.delta.content, chunk
            for d in ch.delta.tool_calls or []:
                e = got.setdefault(d.index, {"id": d.id, "name": "", "arguments": ""})
                e["name"] += d.function.name or ""
                e["arguments"] += d.function.arguments or ""
            finish = ch.finish_reason or finish
    assert finish == "tool_calls", finish
    assert [(e["name"], e["arguments"]) for e in got.values()] == plain(calls), (got, calls)
r = client.chat.completions.create(tool_choice="auto", **tkw)
c = r.choices[0]
assert (c.finish_reason == "tool_calls") == bool(c.message.tool_calls), r
assert c.message.tool_calls or isinstance(c.message.content, str), r
call = client.chat.completions.create(tool_choice="required", **tkw).choices[0].message.tool_calls[0]
history = [
    question,
    {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
    {"role": "tool", "tool_call_id": call.id, "content": "18 degrees and sunny"},
]
r = client.chat.completions.create(model=model, messages=history, tools=tools, max_tokens=30, temperature=0)
assert r.choices[0].message.content or r.choices[0].message.tool_calls, r
for bad in (
    {"tools": [{"type": "function", "function": {"name": "f", "parameters": "x"}}]},
    {"tools": tools, "tool_choice": {"type": "function", "function": {"name": "missing"}}},
    {"tools": tools, "tool_choice": "required", "response_format": {"type": "json_object"}},
):
    try:
        client.chat.completions.create(model=model, messages=[question], **bad)
        raise AssertionError(f"{bad} accepted")
    except openai.BadRequestError as e:
        assert e.status_code == 400

# Other servers' fields (#61): what llama.cpp's web UI sends by default is accepted and
# changes nothing, n_predict is max_tokens, vLLM's guided_choice holds the answer.
webui = {"cache_prompt": True, "typical_p": 1, "xtc_probability": 0, "dry_multiplier": 0,
         "dynatemp_range": 0, "repeat_penalty": 1, "repeat_last_n": 64, "timings_per_token": False}
r = client.completions.create(
    model=model, prompt="The capital of Italy is", temperature=0,
    extra_body={**webui, "n_predict": 12},
)
assert r.choices[0].text == want["completion"], (r, want["completion"])
r = client.chat.completions.create(
    model=model, messages=[{"role": "user", "content": "Is the sky green?"}], temperature=0,
    max_tokens=10, extra_body={"guided_choice": ["yes", "no"]},
)
assert r.choices[0].message.content in ("yes", "no"), r
# vLLM's continue_final_message: the reply continues the assistant's started turn.
r = client.chat.completions.create(
    model=model, temperature=0, max_tokens=8,
    messages=[{"role": "user", "content": "Name a color."}, {"role": "assistant", "content": "My favourite color is"}],
    extra_body={"continue_final_message": True, "add_generation_prompt": False},
)
assert r.choices[0].message.content and r.choices[0].finish_reason in ("stop", "length"), r

# Errors surface as the client's exception types.
try:
    client.chat.completions.create(model=model, messages=[{"role": "user", "content": "x"}], n=17)
    raise AssertionError("n=17 accepted")
except openai.BadRequestError as e:
    assert e.status_code == 400
try:
    client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "x"}], extra_body={"bogus": 1}
    )
    raise AssertionError("an unknown field was accepted")
except openai.BadRequestError:
    pass
try:
    client.chat.completions.create(model="not-this-one", messages=[{"role": "user", "content": "x"}])
    raise AssertionError("an unknown model was accepted")
except openai.NotFoundError:
    pass
try:
    OpenAI(base_url=base, api_key="wrong", max_retries=0).models.list()
    raise AssertionError("a wrong key was accepted")
except openai.AuthenticationError:
    pass
print("openai client: all checks passed")
