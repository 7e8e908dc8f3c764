/* A conversation through the C ABI: each question is answered with the exchanges before
 * it, so a follow-up ("and how long does it take?") may refer to an earlier question.
 *
 *   chat INDEX_DIR CORPUS_DIR MODEL MAX_TOKENS QUESTION [QUESTION...]
 *
 * Indexes CORPUS_DIR (BM25 only), then asks the questions in order. Output per question:
 * "--- answer N", the streamed answer, "--- sources N" and its numbered sources.
 *
 * Build (from the repository root, after `cargo build --release -p rag-capi`), with the
 * shared library as examples/ask.c, or with the static one:
 *   gcc -std=c11 -Wall -Wextra -Irag/capi/include rag/capi/examples/chat.c \
 *       target/release/librag_capi.a -lpthread -ldl -lm -o chat
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rag.h"

static bool print_piece(const char *piece, size_t len, void *user_data) {
    (void)user_data;
    fwrite(piece, 1, len, stdout);
    fflush(stdout);
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

/* A copy owned by the caller (strdup is POSIX, not C11). */
static char *copy(const char *s) {
    size_t len = strlen(s) + 1;
    char *out = malloc(len);
    if (out)
        memcpy(out, s, len);
    return out;
}

static int fail(const char *what, char *error) {
    fprintf(stderr, "%s: %s\n", what, error ? error : "(no message)");
    rag_string_free(error);
    return 1;
}

int main(int argc, char **argv) {
    if (argc < 6) {
        fprintf(stderr, "usage: %s INDEX_DIR CORPUS_DIR MODEL MAX_TOKENS QUESTION [QUESTION...]\n",
                argv[0]);
        return 2;
    }
    char *error = NULL;
    RagAssistant *a = rag_open(argv[1], argv[3], false, 0, &error);
    if (!a)
        return fail("open", error);
    const char *paths[] = {argv[2]};
    if (rag_add_paths(a, paths, 1, NULL, &error) != RAG_OK) {
        rag_close(a);
        return fail("index", error);
    }
    RagAskOptions opts = rag_ask_options_default();
    opts.max_tokens = (size_t)strtoul(argv[4], NULL, 10);

    /* The questions, each followed by its answer (owned copies: an answer is freed as soon
     * as it is printed). */
    int n_questions = argc - 5;
    RagChatMessage *chat = calloc((size_t)(2 * n_questions), sizeof *chat);
    char **answers = calloc((size_t)n_questions, sizeof *answers);
    if (!chat || !answers) {
        rag_close(a);
        return fail("chat", NULL);
    }
    int status = 0;
    size_t n = 0;
    for (int q = 0; q < n_questions; q++) {
        chat[n++] = (RagChatMessage){.role = "user", .content = argv[5 + q]};
        printf("--- answer %d\n", q + 1);
        RagAnswer *ans = rag_chat(a, chat, n, true, &opts, print_piece, NULL, NULL, &error);
        if (!ans) {
            status = fail("chat", error);
            break;
        }
        printf("\n--- sources %d\n", q + 1);
        for (size_t i = 0; i < ans->n_sources; i++) {
            const RagSource *s = &ans->sources[i];
            printf("[%u] ", s->number);
            print_location(s->path, s->line_first, s->line_last, s->page);
            printf("\n");
        }
        answers[q] = copy(ans->text);
        rag_answer_free(ans);
        if (!answers[q]) {
            status = fail("chat", NULL);
            break;
        }
        chat[n++] = (RagChatMessage){.role = "assistant", .content = answers[q]};
    }
    for (int q = 0; q < n_questions; q++)
        free(answers[q]);
    free(answers);
    free(chat);
    rag_close(a);
    return status;
}
