//! Exactness through the server: greedy chat equals `sluice run --chat` token for token, and
//! conversation-state reuse changes prefill work, never output. A follow-up turn prefills only
//! the tokens after the reused prefix (measured from the response and from /metrics), and the
//! time to first token with and without reuse is printed for docs/PERFORMANCE.md.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

mod common;

use common::{post, sluice_bin, tiny_a, Server};
use serde_json::{json, Value};
use sluice_engine::session::common_prefix;
use sluice_tokenizer::{render_k3, ChatMessage, ChatOptions, Role, Tokenizer};
use std::process::Command;
use std::time::Instant;

const EVERY: usize = 16;

fn chat(server: &Server, body: &Value) -> Value {
    let r = post(server.addr, "/v1/chat/completions", body);
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    r.json()
}

fn ids(v: &Value) -> Vec<u64> {
    v["sluice"]["generated_ids"].as_array().unwrap().iter().map(|x| x.as_u64().unwrap()).collect()
}

#[test]
fn greedy_chat_equals_sluice_run_chat() {
    let plain = Server::start(&["--model", &tiny_a(), "--checkpoint-every", "16"]);
    let ngram =
        Server::start(&["--model", &tiny_a(), "--draft", "ngram", "--checkpoint-every", "0"]);
    for (think, text) in [(true, "Hello there"), (false, "What is the capital of France?")] {
        let model = tiny_a();
        let mut args =
            vec!["run", "--model", &model, "--prompt", text, "--chat", "--max-new", "10", "--json"];
        if !think {
            args.push("--no-think");
        }
        let out = Command::new(sluice_bin()).args(&args).output().unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let run: Value = serde_json::from_slice(&out.stdout).unwrap();
        let want: Vec<u64> =
            run["generated_ids"].as_array().unwrap().iter().map(|x| x.as_u64().unwrap()).collect();
        let mut body = json!({"model": "tiny-a", "messages": [{"role": "user", "content": text}],
                              "max_tokens": 10, "temperature": 0});
        if !think {
            body["reasoning_effort"] = json!("none");
        }
        for server in [&plain, &ngram] {
            // Twice: the second request resumes from the stored state.
            for round in 0..2 {
                let v = chat(server, &body);
                assert_eq!(ids(&v), want, "think={think} round={round}");
                assert_eq!(
                    v["usage"]["prompt_tokens"],
                    json!(run["prompt_ids"].as_array().unwrap().len())
                );
            }
        }
    }
}

/// The token ids the server renders for `messages` (same renderer, same options).
fn render(tok: &Tokenizer, messages: &[ChatMessage], thinking: bool) -> Vec<u32> {
    render_k3(tok, messages, &ChatOptions { thinking, ..ChatOptions::default() }).unwrap()
}

/// The snapshot a request resumes from, given the previous conversation (`prompt` then
/// `generated`) and the new prompt: the latest of the checkpoints (multiples of EVERY inside the
/// prompt, the prompt end, the state after generation) usable within the common prefix.
fn expected_reuse(prompt: &[u32], generated: &[u32], next: &[u32]) -> usize {
    let mut context = prompt.to_vec();
    context.extend_from_slice(generated);
    let common = common_prefix(&context, next);
    let final_pos = prompt.len() + generated.len() - 1;
    let mut best = (EVERY..prompt.len()).step_by(EVERY).filter(|&p| p <= common).max().unwrap_or(0);
    if prompt.len() <= common {
        best = best.max(prompt.len());
    }
    if final_pos <= common.min(next.len() - 1) {
        best = best.max(final_pos);
    }
    best
}

#[test]
fn follow_up_turns_prefill_only_new_tokens_and_output_is_unchanged() {
    let tok = Tokenizer::from_dir(tiny_a()).unwrap();
    let reuse = Server::start(&["--model", &tiny_a(), "--checkpoint-every", "16"]);
    let fresh = Server::start(&["--model", &tiny_a(), "--session-memory", "0"]);
    let user1 = ChatMessage::new(Role::User, "Hello there");
    let turn1 = json!({"model": "tiny-a", "messages": [{"role": "user", "content": "Hello there"}],
                       "max_tokens": 6, "temperature": 0});
    let t1 = chat(&reuse, &turn1);
    let gen1: Vec<u32> = ids(&t1).iter().map(|&x| u32::try_from(x).unwrap()).collect();
    let msg = &t1["choices"][0]["message"];
    let mut assistant =
        ChatMessage::new(Role::Assistant, msg["content"].as_str().unwrap_or_default());
    assistant.reasoning_content = msg["reasoning_content"].as_str().map(str::to_owned);
    let user2 = ChatMessage::new(Role::User, "And then?");
    let p1 = render(&tok, std::slice::from_ref(&user1), true);
    let p2 = render(&tok, &[user1.clone(), assistant.clone(), user2.clone()], true);
    let saved0 = reuse.metric("sluice_prefill_tokens_saved_total");
    let messages2 = json!([{"role": "user", "content": "Hello there"},
                           {"role": "assistant", "content": msg["content"], "reasoning_content": msg["reasoning_content"]},
                           {"role": "user", "content": "And then?"}]);
    for body in [
        json!({"model": "tiny-a", "messages": messages2, "max_tokens": 6, "temperature": 0}),
        json!({"model": "tiny-a", "messages": messages2, "max_tokens": 6, "temperature": 0.9, "seed": 7}),
    ] {
        let t0 = Instant::now();
        let a = chat(&reuse, &body);
        let with_s = t0.elapsed().as_secs_f64();
        let t0 = Instant::now();
        let b = chat(&fresh, &body);
        let without_s = t0.elapsed().as_secs_f64();
        assert_eq!(ids(&a), ids(&b), "reuse changed the output of {body}");
        let prompt = a["usage"]["prompt_tokens"].as_u64().unwrap();
        let cached = a["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64().unwrap();
        let prefill = a["sluice"]["prefill_tokens"].as_u64().unwrap();
        assert_eq!(usize::try_from(prompt).unwrap(), p2.len());
        assert_eq!(prefill, prompt - cached, "prefill = prompt - reused");
        assert!(
            usize::try_from(cached).unwrap() >= p1.len(),
            "the whole previous prompt is reused ({cached} < {})",
            p1.len()
        );
        assert_eq!(b["usage"]["prompt_tokens_details"]["cached_tokens"], json!(0));
        println!(
            "follow-up turn: prompt {prompt} tokens, reused {cached}, prefilled {prefill}; engine ttft \
             {:.4}s with reuse vs {:.4}s without; request {with_s:.3}s vs {without_s:.3}s",
            a["sluice"]["ttft_s"].as_f64().unwrap(),
            b["sluice"]["ttft_s"].as_f64().unwrap()
        );
    }
    // The first follow-up resumed exactly where the snapshots allow (the second then found its
    // own prompt end stored).
    let want = expected_reuse(&p1, &gen1, &p2);
    let saved = reuse.metric("sluice_prefill_tokens_saved_total") - saved0;
    #[allow(clippy::cast_precision_loss)]
    let both = (want + p2.len()) as f64;
    assert_eq!(saved, both, "metrics count the reused prefill tokens");

    // An edited first message diverges mid-history: resume from the checkpoint before it.
    let edited = ChatMessage::new(Role::User, "Hello theme");
    let p3 = render(&tok, &[edited, assistant, user2], true);
    let body = json!({"model": "tiny-a", "max_tokens": 4, "temperature": 0, "messages": [
        {"role": "user", "content": "Hello theme"},
        {"role": "assistant", "content": msg["content"], "reasoning_content": msg["reasoning_content"]},
        {"role": "user", "content": "And then?"}]});
    let a = chat(&reuse, &body);
    let b = chat(&fresh, &body);
    assert_eq!(ids(&a), ids(&b));
    let common = common_prefix(&p1, &p3);
    assert_eq!(a["usage"]["prompt_tokens_details"]["cached_tokens"], json!(common / EVERY * EVERY));
}

#[test]
fn same_seed_same_output_with_or_without_reuse_and_speculation() {
    let model = tiny_a();
    let servers = [
        ("plain", Server::start(&["--model", &model, "--session-memory", "0"])),
        ("ngram", Server::start(&["--model", &model, "--session-memory", "0", "--draft", "ngram"])),
        ("reuse", Server::start(&["--model", &model, "--checkpoint-every", "16"])),
        (
            "reuse+ngram",
            Server::start(&["--model", &model, "--checkpoint-every", "16", "--draft", "ngram"]),
        ),
    ];
    let sampling = json!({"temperature": 0.9, "top_p": 0.95, "top_k": 40, "max_tokens": 12});
    let with = |messages: Value, seed: u64| {
        let mut b = sampling.clone();
        b["model"] = json!("tiny-a");
        b["messages"] = messages;
        b["seed"] = json!(seed);
        b
    };
    let first = with(json!([{"role": "user", "content": "Tell me a story about a fox"}]), 11);
    let reference = chat(&servers[0].1, &first);
    let msg = &reference["choices"][0]["message"];
    let follow = with(
        json!([{"role": "user", "content": "Tell me a story about a fox"},
               {"role": "assistant", "content": msg["content"], "reasoning_content": msg["reasoning_content"]},
               {"role": "user", "content": "And the fox?"}]),
        12,
    );
    let want_follow = ids(&chat(&servers[0].1, &follow));
    for (name, s) in &servers {
        // Twice each: the second time a reuse server resumes from the stored prompt end.
        for round in 0..2 {
            assert_eq!(ids(&chat(s, &first)), ids(&reference), "{name} round {round}: turn 1");
            let v = chat(s, &follow);
            assert_eq!(ids(&v), want_follow, "{name} round {round}: follow-up");
            let cached = v["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64().unwrap();
            assert_eq!(cached > 0, name.starts_with("reuse"), "{name}: cached {cached}");
        }
    }
    // A different seed samples differently (so the check above can fail).
    let other: Vec<Vec<u64>> = (20..24)
        .map(|seed| ids(&chat(&servers[2].1, &with(first["messages"].clone(), seed))))
        .collect();
    assert!(
        other.iter().any(|o| *o != ids(&reference)),
        "four other seeds all gave the same tokens"
    );
}

#[test]
fn chat_logprobs_cover_every_generated_token() {
    let s = Server::start(&["--model", &tiny_a()]);
    let v = chat(
        &s,
        &json!({"model": "tiny-a", "messages": [{"role": "user", "content": "Hi"}],
                             "max_tokens": 7, "temperature": 0, "logprobs": true, "top_logprobs": 2}),
    );
    let lp = v["choices"][0]["logprobs"]["content"].as_array().unwrap();
    assert_eq!(json!(lp.len()), v["usage"]["completion_tokens"]);
    for e in lp {
        assert_eq!(e["top_logprobs"].as_array().unwrap().len(), 2, "{e}");
        assert!(e["logprob"].as_f64().unwrap() <= 0.0);
    }
}
