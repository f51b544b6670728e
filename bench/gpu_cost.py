"""What the detectors and the surrogate signals cost on a GPU, measured with torch (the GPU figures of #15 and #16).

    # here: write the real model shapes (the MiniLM and MPNet configs, the surrogate's architecture)
    .venv/bin/python -m bench.gpu_cost prepare --configs .gpu/configs
    # on the GPU host (needs torch + transformers, not the project's venv)
    python3 -m bench.gpu_cost measure --configs .gpu/configs --device cuda --out $OUT/gpu-cost

The serving path runs ONNX graphs through onnxruntime (CUDA provider where there is one). The GPU
machines lent to this project hold onnxruntime without CUDA and cannot fetch onnxruntime-gpu, so the
same architectures run here in torch, with random weights (latency does not depend on the values):
one 512-token row through each encoder (the 3-layer default detector, the 6-layer `detector-full`,
MPNet-base, the untrained quality tier) and the surrogate's passes per white-box signal, shaped like
`bench.surrogate_bench` (512-token context + 128-token answer). Each timed call includes the copy of
the token ids to the device and of the outputs the gateway reads back to the host, as a served
session's would. fp32 is what the exported graphs compute; fp16 shows the head-room of a half graph.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import platform
import sys
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np

ENCODERS = {"minilm-3 (detector)": ("minilm", 3), "minilm-6 (detector-full)": ("minilm", 6),
            "mpnet-12 (quality tier)": ("mpnet", 12)}
CHAT_TOKENS = 48  # chat markup, system turn and question around the passages (the CPU bench's prompts: ~40-50)
LENS_LAYERS = (10, 20)  # the surrogate's intermediate exported layers (models/surrogate/truthlens.json)
TOP_K = 16


def prepare(configs: Path) -> None:
    """Copy the real shapes: the encoders' config.json and the surrogate's architecture."""
    from bench.common import REPO
    from models.shared import MINILM, MPNET, base_model_dir

    configs.mkdir(parents=True, exist_ok=True)
    for key, name in (("minilm", MINILM), ("mpnet", MPNET)):
        (configs / f"{key}.json").write_text((base_model_dir(name) / "config.json").read_text())
    manifest = json.loads((REPO / "models" / "surrogate" / "truthlens.json").read_text())
    arch = manifest["provenance"]["architecture"]
    (configs / "surrogate.json").write_text(json.dumps({"name": manifest["name"], **arch,
                                                         "hidden_layers": manifest["hidden_layers"]}))


def _timer(device: str) -> Callable[[Callable[[], Any], int], dict[str, float]]:
    import torch

    def run(fn: Callable[[], Any], runs: int) -> dict[str, float]:
        for _ in range(5):
            fn()
        times = []
        for _ in range(runs):
            if device == "cuda":
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            fn()  # ends with .cpu(): a device-to-host copy synchronises
            times.append((time.perf_counter() - t0) * 1000)
        return {"p50_ms": float(np.percentile(times, 50)), "p95_ms": float(np.percentile(times, 95)), "runs": runs}
    return run


def encoder(configs: Path, key: str, layers: int, device: str, dtype: Any) -> Any:
    import torch
    from transformers import AutoConfig, AutoModelForTokenClassification

    data = json.loads((configs / f"{key}.json").read_text())
    config = AutoConfig.for_model(data.pop("model_type"), **{k: v for k, v in data.items() if not k.startswith("_")})
    config.num_hidden_layers, config.num_labels = layers, 2
    torch.manual_seed(0)
    return AutoModelForTokenClassification.from_config(config).to(device=device, dtype=dtype).eval()


def surrogate(configs: Path, device: str, dtype: Any) -> Any:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    a = json.loads((configs / "surrogate.json").read_text())
    config = LlamaConfig(vocab_size=a["vocab"], hidden_size=a["hidden"], intermediate_size=a["intermediate"],
                         num_hidden_layers=a["layers"], num_attention_heads=a["heads"],
                         num_key_value_heads=a["kv_heads"], rope_theta=a["rope_base"], rms_norm_eps=a["rms_eps"],
                         tie_word_embeddings=True, max_position_embeddings=2048)
    torch.manual_seed(0)
    return LlamaForCausalLM(config).to(device=device, dtype=dtype).eval()


def surrogate_pass(lm: Any, ids: np.ndarray, score_from: int, device: str, lens: bool, hidden: bool,
                   topk: bool) -> dict[str, np.ndarray]:
    """What one pass of the exported graph computes: next-token log p of the given tokens from
    `score_from` on, and on request the logit lens at the intermediate layers, the hidden states of the
    exported layers, the top-k next-token distribution."""
    import torch

    with torch.inference_mode():
        x = torch.from_numpy(ids).to(device)
        out = lm.model(input_ids=x, output_hidden_states=lens or hidden)
        states = out.hidden_states
        targets = x[:, score_from + 1:]

        def next_logp(h: Any) -> Any:
            logp = torch.log_softmax(lm.lm_head(h[:, score_from:-1]).float(), dim=-1)
            return logp, logp.gather(-1, targets.unsqueeze(-1)).squeeze(-1)

        logp, token_lp = next_logp(out.last_hidden_state)
        result = {"token_logprobs": token_lp}
        if lens:
            result["lens_logprobs"] = torch.stack([next_logp(lm.model.norm(states[i]))[1] for i in LENS_LAYERS])
        if hidden:
            result["hidden_states"] = torch.stack([states[i] for i in (*LENS_LAYERS, len(states) - 1)])
        if topk:
            vals, idx = logp.topk(TOP_K, dim=-1)
            result["topk_logprobs"], result["topk_ids"] = vals, idx
        return {k: v.float().cpu().numpy() if v.is_floating_point() else v.cpu().numpy() for k, v in result.items()}


def measure(configs: Path, device: str, runs: int) -> dict[str, Any]:
    import torch
    import transformers

    from extproc.inference.surrogate import embedding_mmd, lens_emergence

    timer = _timer(device)
    rng = np.random.default_rng(0)
    dtypes = {"fp32": torch.float32, "fp16": torch.float16} if device == "cuda" else {"fp32": torch.float32}
    result: dict[str, Any] = {"encoders": {}, "surrogate": {}}
    for label, dtype in dtypes.items():
        for name, (key, layers) in ENCODERS.items():
            model = encoder(configs, key, layers, device, dtype)
            vocab = model.config.vocab_size
            for batch in (1, 8):
                ids = rng.integers(1000, vocab - 1, size=(batch, 512), dtype=np.int64)

                def window() -> np.ndarray:
                    with torch.inference_mode():
                        x = torch.from_numpy(ids).to(device)
                        logits = model(input_ids=x, attention_mask=torch.ones_like(x)).logits
                        return torch.softmax(logits.float(), -1)[..., 1].cpu().numpy()
                result["encoders"][f"{name} | {label} | {batch}x512"] = timer(window, runs)
        lm = surrogate(configs, device, dtype)
        embeddings = lm.model.embed_tokens.weight.detach().float().cpu().numpy()
        vocab = lm.config.vocab_size
        prompt, answer = 512 + CHAT_TOKENS, 128
        for signals in ("context_pmi", "+ lens_emergence", "+ latent_audit (hidden states)",
                        "+ context_mmd (third pass)", "all four"):
            lens = signals in ("+ lens_emergence", "all four")
            hidden = signals in ("+ latent_audit (hidden states)", "all four")
            other = signals in ("+ context_mmd (third pass)", "all four")

            def read() -> None:
                with torch.inference_mode():
                    grounded = rng.integers(100, vocab - 1, size=(1, prompt + answer), dtype=np.int64)
                    bare = np.concatenate([grounded[:, :CHAT_TOKENS], grounded[:, prompt:]], axis=1)
                    g = surrogate_pass(lm, grounded, prompt - 1, device, lens, hidden, other)
                    b = surrogate_pass(lm, bare, CHAT_TOKENS - 1, device, False, False, False)
                    float(np.mean(g["token_logprobs"][0] - b["token_logprobs"][0]))  # context PMI
                    if lens:
                        lens_emergence(g["lens_logprobs"][:, 0], g["token_logprobs"][0])
                    if other:
                        shuffled = grounded.copy()
                        shuffled[:, CHAT_TOKENS:prompt] = rng.integers(100, vocab - 1, size=prompt - CHAT_TOKENS)
                        o = surrogate_pass(lm, shuffled, prompt - 1, device, False, False, True)
                        embedding_mmd(g["topk_logprobs"][0], g["topk_ids"][0], o["topk_logprobs"][0],
                                      o["topk_ids"][0], embeddings)
            result["surrogate"][f"{signals} | {label}"] = timer(read, runs)
        if device == "cuda":
            torch.cuda.empty_cache()
    gpu = torch.cuda.get_device_name(0) if device == "cuda" else None
    result["machine"] = {"device": device, "gpu": gpu, "torch": torch.__version__,
                         "transformers": transformers.__version__, "python": platform.python_version(),
                         "cuda": torch.version.cuda, "tf32": bool(torch.backends.cuda.matmul.allow_tf32)}
    try:
        import onnxruntime as ort
        result["machine"]["onnxruntime_providers"] = ort.get_available_providers()
    except ImportError:
        result["machine"]["onnxruntime_providers"] = None
    return result


def report(result: dict[str, Any], command: str) -> str:
    m = result["machine"]
    lines = ["# GPU cost: detectors and surrogate signals (torch, random weights of the served shapes)", "",
             f"Command: `{command}`  ", f"Date: {dt.date.today().isoformat()}  ",
             f"Machine: {m['gpu'] or 'CPU'}; torch {m['torch']} (CUDA {m['cuda']}), transformers {m['transformers']}, "
             f"Python {m['python']}; TF32 matmul {'on' if m['tf32'] else 'off'}; onnxruntime providers there: "
             f"{m['onnxruntime_providers']}", "",
             "Why torch: the serving path runs the ONNX graphs through onnxruntime's CUDA provider, but the lent GPU "
             "machine's onnxruntime has no CUDA provider and it cannot fetch onnxruntime-gpu. These are the same "
             "architectures at the same shapes; each call includes the host-to-device copy of the ids and the "
             "device-to-host copy of what the gateway reads. Median and p95 over the runs after 5 warm-ups.", "",
             "## Encoders: one call over B rows of 512 tokens", "",
             "| encoder | precision | rows | p50 ms | p95 ms |", "| --- | --- | ---: | ---: | ---: |"]
    for key, v in result["encoders"].items():
        name, label, shape = key.split(" | ")
        lines.append(f"| {name} | {label} | {shape.split('x')[0]} | {v['p50_ms']:.2f} | {v['p95_ms']:.2f} |")
    lines += ["", f"## Surrogate (SmolLM2-135M shape): 512-token context + 128-token answer ({CHAT_TOKENS} tokens of chat "
              "markup and question), signals as in `bench/results/surrogate.md`", "",
              "| signals | precision | p50 ms | p95 ms |", "| --- | --- | ---: | ---: |"]
    for key, v in result["surrogate"].items():
        name, label = key.split(" | ")
        lines.append(f"| {name} | {label} | {v['p50_ms']:.1f} | {v['p95_ms']:.1f} |")
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("step", choices=("prepare", "measure"))
    ap.add_argument("--configs", type=Path, required=True)
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    ap.add_argument("--runs", type=int, default=50)
    ap.add_argument("--out", type=Path, help="writes OUT.json and OUT.md (measure)")
    args = ap.parse_args()
    if args.step == "prepare":
        prepare(args.configs)
        return 0
    result = measure(args.configs, args.device, args.runs)
    command = "python3 -m bench.gpu_cost " + " ".join(sys.argv[1:])
    result["command"] = command
    text = report(result, command)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.with_suffix(".json").write_text(json.dumps(result, indent=2) + "\n")
        args.out.with_suffix(".md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
