// The llama.cpp side of tools/peer/peer_bench.py: one fresh process per measurement, fed token
// ids (as `sluice run --prompt-ids` is), decoding greedily by argmax over the full logits row
// (no sampler chain, so the only difference from sluice's greedy run is the arithmetic), and
// timing the prompt pass and each one-token pass.
//
//   peer_run MODEL.gguf THREADS N_NEW ID,ID,...
//
// prints one JSON line: {"generated_ids":[...],"prefill_s":S,"decode_s":S,"decode_passes":N,
// "system_info":"..."} (system_info: llama.cpp's list of the ISA features it was built with)
// where prefill_s is the prompt pass (which yields the first new id) and decode_s the N_NEW-1
// one-token passes after it. Before timing, one warm-up pass faults the mapped weights in and
// the memory is cleared again, as llama-bench does, so the timed passes are compute and memory
// reads, not page faults (with the model in memory; in a memory cgroup the faults are the point).
#include "llama.h"

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

static void quiet(enum ggml_log_level, const char *, void *) {}

static double now_s() {
    using namespace std::chrono;
    return duration<double>(steady_clock::now().time_since_epoch()).count();
}

static int argmax(llama_context * ctx, int n_vocab) {
    const float * logits = llama_get_logits_ith(ctx, -1);
    int best = 0;
    for (int i = 1; i < n_vocab; i++) {
        if (logits[i] > logits[best]) {
            best = i;
        }
    }
    return best;
}

int main(int argc, char ** argv) {
    if (argc != 5) {
        std::fprintf(stderr, "usage: %s MODEL.gguf THREADS N_NEW ID,ID,...\n", argv[0]);
        return 2;
    }
    const int threads = std::atoi(argv[2]);
    const int n_new = std::atoi(argv[3]);
    std::vector<llama_token> prompt;
    for (std::string s = argv[4]; !s.empty();) {
        size_t comma = s.find(',');
        prompt.push_back((llama_token) std::atol(s.substr(0, comma).c_str()));
        s = comma == std::string::npos ? "" : s.substr(comma + 1);
    }
    if (threads < 1 || n_new < 1 || prompt.empty()) {
        std::fprintf(stderr, "peer_run: need THREADS >= 1, N_NEW >= 1 and a prompt\n");
        return 2;
    }
    if (std::getenv("PEER_VERBOSE") == nullptr) {
        llama_log_set(quiet, nullptr);
    }
    llama_backend_init();
    llama_model_params mp = llama_model_default_params();
    // PEER_NO_REPACK: no extra buffer types, so the weights stay in the mapped file rather than
    // being repacked into anonymous memory (what a model larger than memory needs).
    if (std::getenv("PEER_NO_REPACK") != nullptr) {
        mp.use_extra_bufts = false;
    }
    llama_model * model = llama_model_load_from_file(argv[1], mp);
    if (model == nullptr) {
        std::fprintf(stderr, "peer_run: llama.cpp cannot load %s\n", argv[1]);
        return 1;
    }
    llama_context_params cp = llama_context_default_params();
    cp.n_ctx = (uint32_t) (prompt.size() + n_new + 16);
    cp.n_batch = cp.n_ctx;
    cp.n_ubatch = cp.n_ctx;
    cp.n_threads = threads;
    cp.n_threads_batch = threads;
    llama_context * ctx = llama_init_from_model(model, cp);
    if (ctx == nullptr) {
        std::fprintf(stderr, "peer_run: cannot create a context\n");
        return 1;
    }
    const int n_vocab = llama_vocab_n_tokens(llama_model_get_vocab(model));

    llama_token warm = prompt[0];
    if (llama_decode(ctx, llama_batch_get_one(&warm, 1)) != 0) {
        std::fprintf(stderr, "peer_run: the warm-up pass failed\n");
        return 1;
    }
    llama_memory_clear(llama_get_memory(ctx), true);

    std::vector<llama_token> out;
    double t0 = now_s();
    if (llama_decode(ctx, llama_batch_get_one(prompt.data(), (int32_t) prompt.size())) != 0) {
        std::fprintf(stderr, "peer_run: the prompt pass failed\n");
        return 1;
    }
    llama_token next = argmax(ctx, n_vocab);
    out.push_back(next);
    const double prefill_s = now_s() - t0;
    t0 = now_s();
    for (int step = 1; step < n_new; step++) {
        if (llama_decode(ctx, llama_batch_get_one(&next, 1)) != 0) {
            std::fprintf(stderr, "peer_run: the one-token pass failed at step %d\n", step);
            return 1;
        }
        next = argmax(ctx, n_vocab);
        out.push_back(next);
    }
    const double decode_s = now_s() - t0;
    std::printf("{\"generated_ids\":[");
    for (size_t i = 0; i < out.size(); i++) {
        std::printf(i ? ",%d" : "%d", out[i]);
    }
    std::string info = llama_print_system_info();
    for (char & c : info) {
        c = (c == '"' || c == '\\' || c == '\n') ? ' ' : c;
    }
    std::printf("],\"prefill_s\":%.6f,\"decode_s\":%.6f,\"decode_passes\":%d,\"system_info\":\"%s\"}\n",
                prefill_s, decode_s, n_new - 1, info.c_str());
    llama_free(ctx);
    llama_model_free(model);
    return 0;
}
