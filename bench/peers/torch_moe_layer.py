#!/usr/bin/env python3
# PyTorch peer benchmark for one MoE layer: what moejit's fused layer is compared with.
#
# Measures, per preset (configs/models/<name>.yaml) and token count T, the wall time of the whole
# layer as people write it in eager PyTorch, bf16 weights/activations, fp32 router logits:
#   route (softmax+top-k[+renorm], or DeepSeek sigmoid+bias grouped top-k [+renorm] x scale),
#   sort tokens by expert (argsort, bincount, cumsum), gather x rows,
#   expert MLP: h = silu(a @ W1[e,:f].T) * (a @ W1[e,f:].T); y = h @ W2[e].T,
#   weighted combine with index_add_ in fp32, output bf16.
# Two variants of the expert MLP: "eager loop" (a Python loop over experts that got tokens) and
# "grouped_mm" (torch._grouped_mm, one call per GEMM; 'n/a' where unavailable or it fails).
# Timing: 3 warm-up runs, then CUDA events around each run (synchronised), median of --iters.
# Each timed run starts from a cold L2, as in `moejit run`: before it, twice the L2's size is
# read in 1 MiB device copies into one 1 MiB target (not timed); --warm-l2 skips that.
# Weights: W1 [E, 2f, d] (gate rows, then up rows), W2 [E, d, f], random, made on the device.
#
# Run (H100, PyTorch >= 2.8 for _grouped_mm):
#   python3 bench/peers/torch_moe_layer.py [--presets a,b] [--tokens 1,32] [--iters 20]
# (--presets also takes config files: --presets my-model.yaml; flow mappings such as
#  `routing: {rule: ...}` are not read, so write routing keys one per line.)
# CPU smoke test of the shape logic with tiny made-up shapes:
#   python3 bench/peers/torch_moe_layer.py --device cpu --tiny --tokens 1,7
import argparse
import os
import statistics
import time

import torch
import torch.nn.functional as F

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ALL_PRESETS = "mixtral-8x7b,qwen3-30b-a3b,deepseek-v3,olmoe-1b-7b"


def parse_yaml_scalars(path):
    """Flattens 'key: scalar' lines of a block-style YAML file into {'a.b.c': value}.
    Enough for configs/models/*.yaml; flow values ({...}, [...]) are skipped."""
    out, stack = {}, []  # stack of (indent, key) for the open mappings
    with open(path) as fh:
        for raw in fh:
            line = raw.split("#", 1)[0].rstrip()
            if not line.strip() or ":" not in line:
                continue
            indent = len(line) - len(line.lstrip())
            key, _, val = line.strip().partition(":")
            while stack and stack[-1][0] >= indent:
                stack.pop()
            val = val.strip()
            if not val:
                stack.append((indent, key))
            elif val[0] not in "{[":
                out[".".join([k for _, k in stack] + [key])] = val
    return out


def load_preset(name, tiny):
    """name: a preset (configs/models/<name>.yaml) or the path of a config file (*.yaml)."""
    path = name if name.endswith((".yaml", ".yml")) else os.path.join(REPO, "configs", "models", name + ".yaml")
    c = parse_yaml_scalars(path)
    if name == path:
        name = c.get("name", os.path.splitext(os.path.basename(path))[0]).strip("'\"")
    num = lambda k, dflt: type(dflt)(c.get("model." + k, dflt))
    p = dict(name=name, d=num("hidden", 0), f=num("expert_width", 0), E=num("experts", 0),
             k=num("top_k", 0), rule=c.get("model.routing.rule", "softmax_topk"),
             renorm=c.get("model.routing.renormalize", "true").lower() in ("true", "yes", "on"),
             n_group=num("routing.n_group", 1), topk_group=num("routing.topk_group", 0),
             scale=num("routing.scaling_factor", 1.0))
    p["topk_group"] = p["topk_group"] or p["n_group"]
    if tiny:  # made-up small shapes, same routing rule; dims kept multiples of 8 for _grouped_mm
        p.update(d=64, f=32, E=16, k=min(p["k"], 4))
        if p["rule"] == "sigmoid_grouped_topk":
            p.update(n_group=4, topk_group=2)
    return p


def make_weights(p, dev):
    """W1 [E, 2f, d], W2 [E, d, f] in bf16, filled one expert chunk at a time on the device
    (deepseek-v3 is ~22 GB: no host copy, no fp32 temporary of the whole thing)."""
    E, d, f = p["E"], p["d"], p["f"]
    w1 = torch.empty(E, 2 * f, d, device=dev, dtype=torch.bfloat16)
    w2 = torch.empty(E, d, f, device=dev, dtype=torch.bfloat16)
    for e0 in range(0, E, 16):
        w1[e0:e0 + 16].normal_(0.0, d ** -0.5)
        w2[e0:e0 + 16].normal_(0.0, f ** -0.5)
    bias = torch.randn(E, device=dev) * 0.1  # DeepSeek's per-expert selection bias
    return w1, w2, bias


def route(p, logits, bias):
    """Returns (topk_w fp32 [T, k], topk_ids int64 [T, k])."""
    k = p["k"]
    if p["rule"] == "softmax_topk":
        w, ids = torch.topk(torch.softmax(logits, dim=-1), k, dim=-1)
    else:  # DeepSeek-V3: groups ranked by the sum of their two best biased scores
        T, E, G = logits.shape[0], p["E"], p["n_group"]
        scores = logits.sigmoid()
        biased = scores + bias
        gscore = biased.view(T, G, E // G).topk(2, dim=-1)[0].sum(-1)
        gidx = gscore.topk(p["topk_group"], dim=-1)[1]
        gmask = torch.zeros_like(gscore).scatter_(1, gidx, 1.0)
        emask = gmask.unsqueeze(-1).expand(T, G, E // G).reshape(T, E)
        ids = biased.masked_fill(emask == 0, float("-inf")).topk(k, dim=-1)[1]
        w = scores.gather(1, ids)
    if p["renorm"]:
        w = w / (w.sum(-1, keepdim=True) + 1e-20)
    return w * p["scale"], ids


def dispatch(p, x, logits, bias):
    """Routing plus sort by expert. Returns sorted rows, their token ids, weights, counts."""
    w, ids = route(p, logits, bias)
    flat = ids.reshape(-1)
    order = torch.argsort(flat, stable=True)
    counts = torch.bincount(flat, minlength=p["E"])
    tok = order // p["k"]  # token of each sorted (token, slot) pair
    return x[tok], tok, w.reshape(-1)[order], counts


def combine(x, ys, tok, ws):
    out = torch.zeros(x.shape[0], x.shape[1], device=x.device, dtype=torch.float32)
    out.index_add_(0, tok, ys.float() * ws.unsqueeze(1))
    return out.to(torch.bfloat16)


def layer_loop(p, x, logits, w1, w2, bias):
    xs, tok, ws, counts = dispatch(p, x, logits, bias)
    f, ys = p["f"], torch.empty_like(xs)
    ends = torch.cumsum(counts, 0).tolist()  # host sync: the loop needs the sizes
    start = 0
    for e, end in enumerate(ends):
        if end > start:
            a = xs[start:end]
            h = F.silu(a @ w1[e, :f].T) * (a @ w1[e, f:].T)
            ys[start:end] = h @ w2[e].T
        start = end
    return combine(x, ys, tok, ws)


def layer_grouped(p, x, logits, w1, w2, bias):
    xs, tok, ws, counts = dispatch(p, x, logits, bias)
    offs = torch.cumsum(counts, 0).to(torch.int32)  # group end offsets, no host sync
    f = p["f"]
    h1 = torch._grouped_mm(xs, w1.transpose(1, 2), offs=offs)  # [T*k, 2f]
    h = F.silu(h1[:, :f]) * h1[:, f:]
    ys = torch._grouped_mm(h, w2.transpose(1, 2), offs=offs)  # [T*k, d]
    return combine(x, ys, tok, ws)


def make_l2_flush(dev, warm):
    """A function that empties L2 before a timed run (None on the CPU or with --warm-l2):
    reads twice the L2's size into one 1 MiB target, so L2 is left with clean lines."""
    if dev.type != "cuda" or warm:
        return None
    chunk = 1 << 20
    l2 = getattr(torch.cuda.get_device_properties(dev), "L2_cache_size", 50 << 20)
    buf = torch.ones(chunk + (2 * l2 + chunk - 1) // chunk * chunk, dtype=torch.uint8, device=dev)

    def flush():
        for off in range(chunk, buf.numel(), chunk):
            buf[:chunk].copy_(buf[off:off + chunk])
    return flush


def time_ms(fn, dev, iters, warmup=3, flush=None):
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(iters):
        if dev.type == "cuda":
            t0, t1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            if flush:
                flush()
            t0.record()
            fn()
            t1.record()
            torch.cuda.synchronize()
            times.append(t0.elapsed_time(t1))
        else:
            s = time.perf_counter()
            fn()
            times.append((time.perf_counter() - s) * 1e3)
    return statistics.median(times)


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--presets", default=ALL_PRESETS,
                    help="comma-separated preset names or config paths (*.yaml)")
    ap.add_argument("--tokens", default="1,32,256,2048,16384")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--tiny", action="store_true", help="tiny made-up shapes (smoke test)")
    ap.add_argument("--warm-l2", action="store_true",
                    help="time runs back to back, L2 warm (the default empties it before each)")
    ap.add_argument("--bias-scale", type=float, default=0.0,
                    help="std of DeepSeek's random selection bias (default 0: none, as moejit run "
                         "routes; 0.1 draws one)")
    args = ap.parse_args()
    dev = torch.device(args.device)
    torch.manual_seed(0)
    has_gmm = hasattr(torch, "_grouped_mm")
    flush = make_l2_flush(dev, args.warm_l2)
    print(f"torch {torch.__version__}, device {dev}"
          + (f" ({torch.cuda.get_device_name(dev)})" if dev.type == "cuda" else "")
          + f", _grouped_mm {'present' if has_gmm else 'absent'}"
          + f", L2 {'warm' if flush is None else 'emptied before each timed run'}", flush=True)
    print(f"{'preset':<16}{'T':>7}{'eager loop ms':>15}{'grouped_mm ms':>15}{'max |diff|':>12}{'experts':>9}",
          flush=True)
    for name in args.presets.split(","):
        p = load_preset(name.strip(), args.tiny)
        w1, w2, bias = make_weights(p, dev)
        bias = bias * (args.bias_scale / 0.1)
        for T in (int(t) for t in args.tokens.split(",")):
            x = torch.randn(T, p["d"], device=dev).to(torch.bfloat16)
            logits = torch.randn(T, p["E"], device=dev)
            run_loop = lambda: layer_loop(p, x, logits, w1, w2, bias)
            run_gmm = lambda: layer_grouped(p, x, logits, w1, w2, bias)
            with torch.no_grad():
                loop_ms = time_ms(run_loop, dev, args.iters, flush=flush)
                gmm, diff = "n/a", ""
                if has_gmm:
                    try:  # check it agrees with the loop, then time it
                        diff = (run_gmm().float() - run_loop().float()).abs().max().item()
                        gmm, diff = f"{time_ms(run_gmm, dev, args.iters, flush=flush):.3f}", f"{diff:.3g}"
                    except (RuntimeError, NotImplementedError) as err:
                        gmm, diff = "n/a", ""
                        print(f"  grouped_mm failed: {str(err).splitlines()[0][:100]}", flush=True)
            with torch.no_grad():  # distinct experts routed to: the weight bytes that must move
                experts = route(p, logits, bias)[1].unique().numel()
            print(f"{p['name']:<16}{T:>7}{loop_ms:>15.3f}{gmm:>15}{diff:>12}{experts:>9}",
                  flush=True)
            del x, logits
        del w1, w2, bias
        if dev.type == "cuda":
            torch.cuda.empty_cache()
    print("done", flush=True)


if __name__ == "__main__":
    main()
