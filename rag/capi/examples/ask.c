/* Index a folder, search it, and stream an answer through the C ABI.
 *
 *   ask INDEX_DIR CORPUS_DIR QUESTION [MODEL [MAX_TOKENS [CANCEL_AFTER]]]
 *
 * CANCEL_AFTER > 0 sets the cancel flag after that many pieces of text (as a "Stop" button
 * on another thread would). Output: the hits, then the streamed answer between
 * "--- answer" and "--- sources", the numbered sources and a summary line.
 *
 * Build (from the repository root, after `cargo build --release -p rag-capi`):
 *   gcc -std=c11 -Wall -Wextra -Irag/capi/include rag/capi/examples/ask.c \
 *       -Ltarget/release -lrag_capi -Wl,-rpath,$PWD/target/release -o ask
 */
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>

#include "rag.h"

struct progress {
    atomic_int cancel;   /* the flag rag_ask polls */
    long pieces;
    long cancel_after;
};

static bool on_text(const char *piece, size_t len, void *user_data) {
    struct progress *p = user_data;
    fwrite(piece, 1, len, stdout);
    fflush(stdout);
    if (++p->pieces == p->cancel_after)
        atomic_store(&p->cancel, 1);
    return true;
}

/* path:first-last, path#page, or the bare path (HTML). */
static void print_location(const char *path, uint32_t first, uint32_t last, uint32_t page) {
    if (page)
        printf("%s#%u", path, page);
    else if (first)
        printf("%s:%u-%u", path, first, last);
    else
        printf("%s", path);
}

static int fail(const char *what, char *error) {
    fprintf(stderr, "%s: %s\n", what, error ? error : "(no message)");
    rag_string_free(error);
    return 1;
}

int main(int argc, char **argv) {
    if (argc < 4) {
        fprintf(stderr, "usage: %s INDEX_DIR CORPUS_DIR QUESTION [MODEL [MAX_TOKENS [CANCEL_AFTER]]]\n", argv[0]);
        return 2;
    }
    const char *model = argc > 4 ? argv[4] : NULL;
    char *error = NULL;
    RagAssistant *a = rag_open(argv[1], model, true, 0, &error);
    if (!a)
        return fail("open", error);

    const char *paths[] = {argv[2]};
    uint64_t chunks = 0;
    if (rag_add_paths(a, paths, 1, &chunks, &error) != RAG_OK) {
        rag_close(a);
        return fail("index", error);
    }
    printf("indexed: %llu chunks\n", (unsigned long long)chunks);

    RagHits *hits = rag_search(a, argv[3], 3, "hybrid", &error);
    if (!hits) {
        rag_close(a);
        return fail("search", error);
    }
    for (size_t i = 0; i < hits->len; i++) {
        const RagHit *h = &hits->hits[i];
        printf("hit %zu: ", i + 1);
        print_location(h->path, h->line_first, h->line_last, h->page);
        printf(" score %.4f\n", h->score);
    }
    rag_hits_free(hits);

    RagAskOptions opts = rag_ask_options_default();
    if (argc > 5)
        opts.max_tokens = (size_t)strtoul(argv[5], NULL, 10);
    struct progress p = {.pieces = 0, .cancel_after = argc > 6 ? strtol(argv[6], NULL, 10) : 0};
    atomic_init(&p.cancel, 0);
    printf("--- answer\n");
    /* atomic_int has the size and alignment of int32_t on every platform rag supports. */
    RagAnswer *ans = rag_ask(a, argv[3], &opts, on_text, &p, (const int32_t *)&p.cancel, &error);
    if (!ans) {
        rag_close(a);
        return fail("ask", error);
    }
    printf("\n--- sources\n");
    for (size_t i = 0; i < ans->n_sources; i++) {
        const RagSource *s = &ans->sources[i];
        printf("[%u] ", s->number);
        print_location(s->path, s->line_first, s->line_last, s->page);
        printf("\n");
    }
    printf("tokens: %zu, cancelled: %s, first token %.0f ms, decode %.1f tok/s\n",
           ans->tokens_generated, ans->cancelled ? "yes" : "no", ans->first_token_ms,
           ans->decode_tok_s);
    rag_answer_free(ans);
    rag_close(a);
    return 0;
}
