// Teacher-forced top-k logits from llama.cpp, for paradraft's parity checks (a fixture tool:
// built by scripts/quant/parity.sh against a llama.cpp build, never part of paradraft).
//
//   llama_logits MODEL.gguf IDS.txt TOPK [KV]   (IDS.txt: one prompt per line, token ids
//                                                separated by spaces; KV: the cache type,
//                                                f16 (default) or q8_0 — llama.cpp's -ctk/-ctv,
//                                                with flash attention as q8_0 V requires)
//   -> one JSON line per prompt on stdout:
//   {"ids": [...], "top": [[[id, logit], ...] per position]}
#include "llama.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void log_quiet(enum ggml_log_level level, const char *text, void *ud) {
    (void)level; (void)text; (void)ud;
}

int main(int argc, char **argv) {
    if (argc != 4 && argc != 5) {
        fprintf(stderr, "usage: %s MODEL.gguf IDS.txt TOPK [f16|q8_0]\n", argv[0]);
        return 2;
    }
    int q8 = argc == 5 && strcmp(argv[4], "q8_0") == 0;
    if (argc == 5 && !q8 && strcmp(argv[4], "f16") != 0) {
        fprintf(stderr, "unknown KV type %s (f16 or q8_0)\n", argv[4]);
        return 2;
    }
    int topk = atoi(argv[3]);
    llama_log_set(log_quiet, NULL);
    llama_backend_init();
    struct llama_model_params mp = llama_model_default_params();
    struct llama_model *model = llama_model_load_from_file(argv[1], mp);
    if (!model) { fprintf(stderr, "cannot load %s\n", argv[1]); return 1; }
    const struct llama_vocab *vocab = llama_model_get_vocab(model);
    int nv = llama_vocab_n_tokens(vocab);
    struct llama_context_params cp = llama_context_default_params();
    cp.n_ctx = 2048; cp.n_batch = 2048; cp.n_ubatch = 2048; cp.n_threads = 2; cp.n_threads_batch = 2;
    if (argc == 5) {
        // Both caches in the type asked, both through flash attention, so that the two runs
        // differ in the cache type only.
        cp.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_ENABLED;
        cp.type_k = cp.type_v = q8 ? GGML_TYPE_Q8_0 : GGML_TYPE_F16;
    }
    struct llama_context *ctx = llama_init_from_model(model, cp);
    if (!ctx) { fprintf(stderr, "cannot make a context\n"); return 1; }
    FILE *f = fopen(argv[2], "r");
    if (!f) { fprintf(stderr, "cannot open %s\n", argv[2]); return 1; }
    static char line[1 << 20];
    int *idx = malloc(sizeof(int) * nv);
    while (fgets(line, sizeof line, f)) {
        int ids[2048], n = 0;
        for (char *tok = strtok(line, " \n"); tok && n < 2048; tok = strtok(NULL, " \n")) ids[n++] = atoi(tok);
        if (n == 0) continue;
        llama_memory_clear(llama_get_memory(ctx), true);
        struct llama_batch b = llama_batch_init(n, 0, 1);
        for (int i = 0; i < n; i++) {
            b.token[i] = ids[i]; b.pos[i] = i; b.n_seq_id[i] = 1; b.seq_id[i][0] = 0; b.logits[i] = 1;
        }
        b.n_tokens = n;
        if (llama_decode(ctx, b) != 0) { fprintf(stderr, "decode failed\n"); return 1; }
        printf("{\"ids\": [");
        for (int i = 0; i < n; i++) printf(i ? ", %d" : "%d", ids[i]);
        printf("], \"top\": [");
        for (int i = 0; i < n; i++) {
            const float *lg = llama_get_logits_ith(ctx, i);
            // partial selection of the top-k
            for (int v = 0; v < nv; v++) idx[v] = v;
            for (int k = 0; k < topk; k++) {
                int best = k;
                for (int v = k + 1; v < nv; v++) if (lg[idx[v]] > lg[idx[best]]) best = v;
                int t = idx[k]; idx[k] = idx[best]; idx[best] = t;
            }
            printf(i ? ", [" : "[");
            for (int k = 0; k < topk; k++) printf(k ? ", [%d, %.6f]" : "[%d, %.6f]", idx[k], lg[idx[k]]);
            printf("]");
        }
        printf("]}\n");
        llama_batch_free(b);
    }
    fclose(f);
    free(idx);
    llama_free(ctx);
    llama_model_free(model);
    return 0;
}
