/* One-thread greedy generation with llama.cpp, for `dualpath bench arm`: the peer's side of
 * an instructions-per-token count under qemu-aarch64, linked static against libllama.a.
 *
 *   llama_greedy MODEL IDS_FILE NUM_GENERATE FLASH_ATTN N_CTX [MAPS_OUT]
 *
 * IDS_FILE holds the prompt's token ids (whitespace-separated), so that llama.cpp and
 * DualPath start from the same ids whatever their tokenizers make of a text. The prompt
 * is decoded in one batch, its last logits give the first token (argmax), then each
 * token is decoded alone until NUM_GENERATE tokens are out (end-of-generation tokens
 * included: the count of decode steps is what is measured). Both n_threads and
 * n_threads_batch are 1. FLASH_ATTN is on, off or auto (llama.cpp's -fa).
 *
 * Prints `system_info: ...` (llama_print_system_info) and `ids: ...` (the generated ids)
 * on stdout. MAPS_OUT, when given, receives a copy of /proc/self/maps at the end (under
 * qemu-aarch64, guest addresses), for attributing counts to functions.
 *
 * Exit status: 0, 2 for bad arguments, 3 when the model or context cannot be made, 4 when
 * a decode fails. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "llama.h"

#define MAX_PROMPT_TOKENS 65536

/* llama.cpp's log to stderr, warnings and errors only: the info lines of a load are long
 * and add nothing to a count. */
static void log_quiet(enum ggml_log_level level, const char *text, void *user_data) {
    (void)user_data;
    if (level >= GGML_LOG_LEVEL_WARN && level != GGML_LOG_LEVEL_CONT) fputs(text, stderr);
}

static int read_ids(const char *path, llama_token *ids, int max_ids) {
    FILE *f = fopen(path, "r");
    if (!f) return -1;
    int n = 0;
    long v;
    while (n < max_ids && fscanf(f, "%ld", &v) == 1) ids[n++] = (llama_token)v;
    fclose(f);
    return n;
}

static llama_token argmax(const float *logits, int n_vocab) {
    int best = 0;
    for (int i = 1; i < n_vocab; i++)
        if (logits[i] > logits[best]) best = i;
    return (llama_token)best;
}

static int copy_maps(const char *dst) {
    FILE *in = fopen("/proc/self/maps", "r"), *out = fopen(dst, "w");
    int ok = in && out;
    char buf[4096];
    size_t n;
    while (ok && (n = fread(buf, 1, sizeof buf, in)) > 0) ok = fwrite(buf, 1, n, out) == n;
    if (in) fclose(in);
    if (out && fclose(out) != 0) ok = 0;
    return ok;
}

int main(int argc, char **argv) {
    if (argc < 6 || argc > 7) {
        fprintf(stderr, "usage: %s MODEL IDS_FILE NUM_GENERATE on|off|auto N_CTX [MAPS_OUT]\n", argv[0]);
        return 2;
    }
    const char *model_path = argv[1], *ids_path = argv[2], *fa = argv[4];
    const int num_generate = atoi(argv[3]), n_ctx = atoi(argv[5]);
    enum llama_flash_attn_type fa_type;
    if (strcmp(fa, "on") == 0) fa_type = LLAMA_FLASH_ATTN_TYPE_ENABLED;
    else if (strcmp(fa, "off") == 0) fa_type = LLAMA_FLASH_ATTN_TYPE_DISABLED;
    else if (strcmp(fa, "auto") == 0) fa_type = LLAMA_FLASH_ATTN_TYPE_AUTO;
    else {
        fprintf(stderr, "flash attention must be on, off or auto, not %s\n", fa);
        return 2;
    }
    static llama_token prompt[MAX_PROMPT_TOKENS];
    const int num_prompt = read_ids(ids_path, prompt, MAX_PROMPT_TOKENS);
    if (num_prompt <= 0) {
        fprintf(stderr, "%s: no token ids (whitespace-separated integers) could be read\n", ids_path);
        return 2;
    }
    if (num_generate < 1 || n_ctx < num_prompt + num_generate) {
        fprintf(stderr, "NUM_GENERATE=%d must be at least 1, and N_CTX=%d at least the prompt's %d tokens plus it\n",
                num_generate, n_ctx, num_prompt);
        return 2;
    }

    llama_log_set(log_quiet, NULL);
    llama_backend_init();
    struct llama_model_params mp = llama_model_default_params();
    mp.n_gpu_layers = 0;
    struct llama_model *model = llama_model_load_from_file(model_path, mp);
    if (!model) {
        fprintf(stderr, "%s: llama.cpp could not load the model\n", model_path);
        return 3;
    }
    struct llama_context_params cp = llama_context_default_params();
    cp.n_ctx = (uint32_t)n_ctx;
    cp.n_batch = cp.n_ubatch = (uint32_t)(num_prompt > 512 ? num_prompt : 512); /* the prompt is one batch */
    cp.n_seq_max = 1;
    cp.n_threads = cp.n_threads_batch = 1;
    cp.flash_attn_type = fa_type;
    cp.no_perf = true;
    struct llama_context *ctx = llama_init_from_model(model, cp);
    if (!ctx) {
        fprintf(stderr, "llama.cpp could not make a context of %d tokens\n", n_ctx);
        llama_model_free(model);
        return 3;
    }
    printf("system_info: %s\n", llama_print_system_info());
    const int n_vocab = llama_vocab_n_tokens(llama_model_get_vocab(model));

    int status = 0;
    llama_token token;
    printf("ids:");
    if (llama_decode(ctx, llama_batch_get_one(prompt, num_prompt)) != 0) {
        fprintf(stderr, "llama_decode failed on the %d-token prompt\n", num_prompt);
        status = 4;
    }
    for (int i = 0; status == 0 && i < num_generate; i++) {
        token = argmax(llama_get_logits_ith(ctx, -1), n_vocab);
        printf(" %d", (int)token);
        if (i + 1 < num_generate && llama_decode(ctx, llama_batch_get_one(&token, 1)) != 0) {
            fprintf(stderr, "llama_decode failed on generated token %d\n", i + 1);
            status = 4;
        }
    }
    printf("\n");
    if (argc == 7 && !copy_maps(argv[6])) fprintf(stderr, "%s: cannot copy /proc/self/maps there\n", argv[6]);
    fflush(stdout);
    llama_free(ctx);
    llama_model_free(model);
    llama_backend_free();
    return status;
}
