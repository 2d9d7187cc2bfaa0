// llama-logits: llama.cpp's logits, row by row, as an oracle for ours (smallem's own program,
// built beside llama.cpp's tools by `smallem llama`; see smallem/book/ch4/llama.py).
//
//   llama-logits -m MODEL.gguf -t THREADS -n STEPS -o OUT.bin [-v] ID[,ID...]
//
// Loads MODEL on the CPU, feeds the prompt's token ids (ids, not text: no tokenizer, no BOS
// added) as one batch, then decodes STEPS tokens greedily (the first largest logit, as
// llama.cpp's greedy sampler takes it; an end-of-generation token does not stop it). OUT.bin
// receives, little-endian:
//   int32 rows (= STEPS + 1), int32 n_vocab,
//   int32 chosen[rows]            argmax of each row; chosen[0..STEPS-1] were fed back,
//   float32 logits[rows][n_vocab] row 0 at the prompt's last position, row k after chosen[k-1].
// The context is llama-simple's: llama_context_default_params() (flash attention "auto", K and
// V caches in F16, no offload target on a CPU-only build), n_ctx = prompt + STEPS, the prompt
// in one batch; only the thread counts are set (to THREADS, for single tokens and batches).
// The weights stay in llama.cpp's plain CPU buffers (use_extra_bufts off: no repacked or AMX
// layouts): an oracle is the reference path, and a build with AMX sums an F16 matrix on
// another path (its logits moved past the F16 tolerance on a gemma3 file).
// A bad argument, an unreadable model or a failed decode prints one line on stderr and exits
// with status 1 (2 for bad usage), with llama.cpp's last error in it; llama.cpp's own log is
// shown only with -v.
#include "llama.h"

#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <string>
#include <vector>

namespace {

bool verbose = false;
std::string last_error;  // llama.cpp's last error message, for our one line

void quiet_log(enum ggml_log_level level, const char * text, void *) {
    if (verbose) {
        fputs(text, stderr);
    }
    if (level == GGML_LOG_LEVEL_ERROR) {
        last_error = text;
        while (!last_error.empty() && isspace((unsigned char) last_error.back())) {
            last_error.pop_back();
        }
        for (char & c : last_error) {
            if (c == '\n') c = ' ';
        }
    }
}

std::string said() {
    return last_error.empty() ? "" : " (" + last_error + ")";
}

int usage(const std::string & why) {
    fprintf(stderr, "llama-logits: %s (usage: llama-logits -m MODEL.gguf -t THREADS -n STEPS "
                    "-o OUT.bin [-v] ID[,ID...])\n", why.c_str());
    return 2;
}

int fail(const std::string & why) {
    fprintf(stderr, "llama-logits: %s\n", why.c_str());
    return 1;
}

// a whole decimal integer in [lo, hi], or false
bool parse_int(const char * s, long lo, long hi, long & out) {
    if (s == nullptr || *s == '\0') {
        return false;
    }
    char * end = nullptr;
    errno = 0;
    const long v = strtol(s, &end, 10);
    if (errno != 0 || end == s || *end != '\0' || v < lo || v > hi) {
        return false;
    }
    out = v;
    return true;
}

// llama_batch_ext holding tokens[0..n) at positions pos0.., logits asked for the last one only
bool fill(llama_batch_ext * batch, const llama_token * tokens, int n, llama_pos pos0) {
    llama_batch_ext_clear(batch);
    for (int i = 0; i < n; ++i) {
        const int32_t idx = llama_batch_ext_add_token(batch, 0, tokens[i]);
        if (idx < 0) {
            return false;
        }
        const llama_pos pos = pos0 + i;
        if (!llama_batch_ext_set_pos(batch, idx, &pos)) {
            return false;
        }
    }
    return llama_batch_ext_set_output_logits(batch, n - 1, true);
}

int run(int argc, char ** argv) {
    std::string model_path, out_path, ids_text;
    long threads = -1, steps = -1;
    for (int i = 1; i < argc; ++i) {
        const std::string a = argv[i];
        const bool has_value = i + 1 < argc;
        if (a == "-v") {
            verbose = true;
        } else if (a == "-m" || a == "-o" || a == "-t" || a == "-n") {
            if (!has_value) {
                return usage(a + " needs a value");
            }
            const char * v = argv[++i];
            if (a == "-m") {
                model_path = v;
            } else if (a == "-o") {
                out_path = v;
            } else if (a == "-t" && !parse_int(v, 1, 1024, threads)) {
                return usage(std::string("-t wants a thread count from 1 to 1024, not '") + v + "'");
            } else if (a == "-n" && !parse_int(v, 0, 1 << 20, steps)) {
                return usage(std::string("-n wants a number of steps >= 0, not '") + v + "'");
            }
        } else if (!a.empty() && a[0] == '-' && !(a.size() > 1 && isdigit((unsigned char) a[1]))) {
            return usage("unknown option " + a);
        } else if (!ids_text.empty()) {
            return usage("one list of token ids, comma-separated, not several arguments");
        } else {
            ids_text = a;
        }
    }
    if (model_path.empty()) return usage("no model (-m)");
    if (out_path.empty()) return usage("no output file (-o)");
    if (threads < 0) return usage("no thread count (-t)");
    if (steps < 0) return usage("no number of steps (-n)");
    if (ids_text.empty()) return usage("no prompt token ids");

    std::vector<llama_token> prompt;
    for (size_t start = 0; start <= ids_text.size();) {
        size_t comma = ids_text.find(',', start);
        if (comma == std::string::npos) comma = ids_text.size();
        const std::string piece = ids_text.substr(start, comma - start);
        long id;
        if (!parse_int(piece.c_str(), 0, 0x7fffffffL, id)) {
            return usage("token id '" + piece + "' is not a whole number >= 0");
        }
        prompt.push_back((llama_token) id);
        start = comma + 1;
    }

    FILE * probe = fopen(model_path.c_str(), "rb");
    if (probe == nullptr) {
        return fail("cannot read " + model_path + ": " + strerror(errno));
    }
    fclose(probe);

    llama_log_set(quiet_log, nullptr);
    llama_backend_init();

    llama_model_params mparams = llama_model_default_params();
    mparams.n_gpu_layers = 0;
    mparams.use_extra_bufts = false;
    llama_model * model = llama_model_load_from_file(model_path.c_str(), mparams);
    if (model == nullptr) {
        return fail("llama.cpp could not load " + model_path + said());
    }
    const llama_vocab * vocab = llama_model_get_vocab(model);
    const int n_vocab = llama_vocab_n_tokens(vocab);
    for (llama_token id : prompt) {
        if (id >= n_vocab) {
            llama_model_free(model);
            return fail("token id " + std::to_string(id) + " is outside the vocabulary (" +
                        std::to_string(n_vocab) + " tokens)");
        }
    }
    const long n_ctx = (long) prompt.size() + steps;
    const long n_train = llama_model_n_ctx_train(model);
    if (n_train > 0 && n_ctx > n_train) {
        llama_model_free(model);
        return fail("prompt + steps = " + std::to_string(n_ctx) + " positions, more than the "
                    "model's context of " + std::to_string(n_train));
    }

    llama_context_params cparams = llama_context_default_params();
    cparams.n_ctx = (uint32_t) n_ctx;
    cparams.n_batch = (uint32_t) prompt.size();
    cparams.n_threads = (int32_t) threads;
    cparams.n_threads_batch = (int32_t) threads;
    llama_context * ctx = llama_init_from_model(model, cparams);
    if (ctx == nullptr) {
        llama_model_free(model);
        return fail("llama.cpp could not make a context for " + model_path + said());
    }
    llama_batch_ext * batch = llama_batch_ext_init(ctx);

    const long rows = steps + 1;
    std::vector<float> logits((size_t) rows * n_vocab);
    std::vector<int32_t> chosen((size_t) rows);
    std::string error;
    llama_pos pos = 0;
    const llama_token * feed = prompt.data();
    int n_feed = (int) prompt.size();
    for (long r = 0; r < rows; ++r) {
        if (!fill(batch, feed, n_feed, pos)) {
            error = "could not fill a batch of " + std::to_string(n_feed) + " tokens";
            break;
        }
        const int32_t rc = llama_process(ctx, LLAMA_PROCESS_TYPE_DECODE, batch);
        if (rc != 0) {
            error = "llama_process failed at position " + std::to_string(pos) + ", status " +
                    std::to_string(rc) + said();
            break;
        }
        pos += n_feed;
        const float * row = llama_get_logits_ith(ctx, -1);
        if (row == nullptr) {
            error = "no logits at position " + std::to_string(pos - 1);
            break;
        }
        float * dst = logits.data() + (size_t) r * n_vocab;
        memcpy(dst, row, sizeof(float) * (size_t) n_vocab);
        int32_t best = 0;
        for (int v = 1; v < n_vocab; ++v) {
            if (dst[v] > dst[best]) best = v;  // the first of equal largest, as the greedy sampler
        }
        chosen[(size_t) r] = best;
        feed = &chosen[(size_t) r];
        n_feed = 1;
    }
    llama_batch_ext_free(batch);
    llama_free(ctx);
    llama_model_free(model);
    llama_backend_free();
    if (!error.empty()) {
        return fail(error);
    }

    FILE * out = fopen(out_path.c_str(), "wb");
    if (out == nullptr) {
        return fail("cannot write " + out_path + ": " + strerror(errno));
    }
    const int32_t head[2] = {(int32_t) rows, (int32_t) n_vocab};
    bool ok = fwrite(head, sizeof(head), 1, out) == 1 &&
              fwrite(chosen.data(), sizeof(int32_t), chosen.size(), out) == chosen.size() &&
              fwrite(logits.data(), sizeof(float), logits.size(), out) == logits.size();
    ok = (fclose(out) == 0) && ok;
    if (!ok) {
        return fail("could not write all of " + out_path);
    }
    return 0;
}

}  // namespace

int main(int argc, char ** argv) {
    try {
        return run(argc, argv);
    } catch (const std::exception & e) {
        return fail(std::string("stopped: ") + e.what());
    } catch (...) {
        return fail("stopped by an unknown exception");
    }
}
