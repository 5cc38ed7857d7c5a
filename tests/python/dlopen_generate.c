/* A program that loads llama.cpp with dlopen and computes at once, as a
 * Node addon or a Python client does: nothing of ggml is linked, so ttrace
 * can find it only once it is loaded.
 *
 *   dlopen_generate LIBLLAMA MODEL PROMPT N
 *
 * Greedy sampling of N tokens after PROMPT, two threads, context 256.
 * Prints its own counts (`prompt_tokens=P`, `eval_runs=N`) on stdout;
 * llama.cpp logs its buffers on stderr. */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "llama.h"

#define LOAD(name)                                                                 \
    __typeof__(name) *p_##name = (__typeof__(name) *)dlsym(lib, #name);            \
    if (!p_##name) {                                                               \
        fprintf(stderr, "dlopen_generate: %s has no %s\n", argv[1], #name);        \
        return 2;                                                                  \
    }

int main(int argc, char **argv) {
    if (argc != 5) {
        fprintf(stderr, "usage: %s LIBLLAMA MODEL PROMPT N\n", argv[0]);
        return 2;
    }
    void *lib = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        fprintf(stderr, "dlopen_generate: %s\n", dlerror());
        return 2;
    }
    LOAD(llama_backend_init)
    LOAD(llama_model_default_params)
    LOAD(llama_model_load_from_file)
    LOAD(llama_context_default_params)
    LOAD(llama_init_from_model)
    LOAD(llama_model_get_vocab)
    LOAD(llama_vocab_n_tokens)
    LOAD(llama_tokenize)
    LOAD(llama_batch_get_one)
    LOAD(llama_decode)
    LOAD(llama_get_logits_ith)
    LOAD(llama_free)
    LOAD(llama_model_free)

    const char *prompt = argv[3];
    int n_predict = atoi(argv[4]);
    p_llama_backend_init();
    struct llama_model *model = p_llama_model_load_from_file(argv[2], p_llama_model_default_params());
    if (!model) {
        fprintf(stderr, "dlopen_generate: cannot load %s\n", argv[2]);
        return 1;
    }
    struct llama_context_params cparams = p_llama_context_default_params();
    cparams.n_ctx = 256;
    cparams.n_batch = 256;
    cparams.n_threads = 2;
    cparams.n_threads_batch = 2;
    struct llama_context *ctx = p_llama_init_from_model(model, cparams);
    if (!ctx) {
        fprintf(stderr, "dlopen_generate: cannot create a context\n");
        return 1;
    }
    const struct llama_vocab *vocab = p_llama_model_get_vocab(model);
    int n_vocab = p_llama_vocab_n_tokens(vocab);
    int n_prompt = -p_llama_tokenize(vocab, prompt, (int)strlen(prompt), NULL, 0, true, true);
    llama_token *tokens = malloc(sizeof(llama_token) * (size_t)n_prompt);
    if (p_llama_tokenize(vocab, prompt, (int)strlen(prompt), tokens, n_prompt, true, true) != n_prompt) {
        fprintf(stderr, "dlopen_generate: tokenizing failed\n");
        return 1;
    }
    printf("prompt_tokens=%d\n", n_prompt);
    fflush(stdout);

    /* Sample N tokens: the prompt's decode gives the first, and each
     * later one needs a decode of the one before (N - 1 eval runs, as
     * llama.cpp's own tools count them). */
    struct llama_batch batch = p_llama_batch_get_one(tokens, n_prompt);
    llama_token next;
    for (int i = 0; i < n_predict; i++) {
        if (p_llama_decode(ctx, batch) != 0) {
            fprintf(stderr, "dlopen_generate: decode %d failed\n", i);
            return 1;
        }
        const float *logits = p_llama_get_logits_ith(ctx, -1);
        next = 0;
        for (int t = 1; t < n_vocab; t++) {
            if (logits[t] > logits[next]) {
                next = t;
            }
        }
        batch = p_llama_batch_get_one(&next, 1);
    }
    printf("eval_runs=%d\n", n_predict - 1);
    p_llama_free(ctx);
    p_llama_model_free(model);
    free(tokens);
    return 0;
}
