"""A float graph for GPUs from a dynamically quantized (int8) encoder graph.

onnxruntime's CUDA provider runs the quantized ops of the shipped int8 graphs on the CPU, with copies
to and from the GPU around them, which measured slower than the CPU alone (bench/results/inference-cuda.md).
This rewrites each quantized op as its float twin over the same weights, dequantized by a
DequantizeLinear node per weight (the file stays int8-sized; onnxruntime folds those nodes into float
weights when it loads the graph):

- QEmbedLayerNormalization -> EmbedLayerNormalization
- QAttention -> Attention (its input read before DynamicQuantizeLinear)
- DynamicQuantizeLinear -> MatMulInteger -> Cast -> Mul(scales) -> MatMul

The weights are the int8 graph's, so the scores stay close to it; activations are no longer quantized, which
moves them a little (bench/results/inference-cuda-float.md). Needs the `onnx` package (the CUDA image installs
it; the CPU path never imports this module).
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Any

MS = "com.microsoft"


class FloatGraphError(ValueError):
    """The graph has a quantized pattern this rewrite does not know."""


def float_graph(model: Any) -> Any:
    """The rewritten ModelProto (`model` is not changed)."""
    import onnx
    from onnx import helper

    m = onnx.ModelProto()
    m.CopyFrom(model)
    g = m.graph
    inits = {t.name for t in g.initializer}
    producer = {o: n for n in g.node for o in n.output}
    consumers: dict[str, list[Any]] = defaultdict(list)
    for n in g.node:
        for i in n.input:
            consumers[i].append(n)
    new_nodes: list[Any] = []
    dequantized: dict[str, str] = {}

    def dq(weight: str, scale: str, zero: str) -> str:
        """The float twin of a quantized weight initializer (one DequantizeLinear node per weight)."""
        if weight not in inits:
            raise FloatGraphError(f"{weight}: a quantized weight that is not an initializer")
        if weight not in dequantized:
            dequantized[weight] = f"{weight}_float"
            new_nodes.append(helper.make_node("DequantizeLinear", [weight, scale, zero], [dequantized[weight]],
                                              name=f"{weight}_dequantize"))
        return dequantized[weight]

    def float_input(quantized: str) -> str:
        """What a DynamicQuantizeLinear quantized: the float tensor before it."""
        n = producer.get(quantized)
        if n is None or n.op_type != "DynamicQuantizeLinear":
            raise FloatGraphError(f"{quantized}: not the output of DynamicQuantizeLinear")
        return n.input[0]

    replaced: set[int] = set()
    for n in g.node:
        if n.op_type == "QEmbedLayerNormalization":
            ids, seg, *q = n.input[:7]
            mask = n.input[7] if len(n.input) > 7 else ""
            scales, zeros = n.input[8:13], n.input[13:18]
            floats = [dq(w, s, z) for w, s, z in zip(q, scales, zeros)]
            new_nodes.append(helper.make_node("EmbedLayerNormalization", [ids, seg, *floats, mask], list(n.output),
                                              name=n.name or "EmbedLayerNormalization", domain=MS,
                                              epsilon=_attr(n, "epsilon", 1e-12)))
            replaced.add(id(n))
        elif n.op_type == "QAttention":
            x_q, w_q, bias, _x_scale, w_scale, mask, _x_zero, w_zero = (list(n.input) + [""] * 8)[:8]
            past = n.input[8] if len(n.input) > 8 else ""
            inputs = [float_input(x_q), dq(w_q, w_scale, w_zero), bias, mask] + ([past] if past else [])
            attrs = {a.name: helper.get_attribute_value(a) for a in n.attribute}
            new_nodes.append(helper.make_node("Attention", inputs, list(n.output), name=n.name or "Attention",
                                              domain=MS, **attrs))
            replaced.add(id(n))
        elif n.op_type == "MatMulInteger":
            x_q, w_q, _x_zero, w_zero = (list(n.input) + [""] * 4)[:4]
            after = consumers[n.output[0]]
            cast = after[0] if len(after) == 1 else None
            if cast is None or cast.op_type != "Cast" or len(consumers[cast.output[0]]) != 1:
                raise FloatGraphError(f"{n.name}: MatMulInteger not followed by Cast and one Mul")
            (mul,) = consumers[cast.output[0]]
            scale_in = mul.input[1] if mul.input[0] == cast.output[0] else mul.input[0]
            scales = producer.get(scale_in)
            if mul.op_type != "Mul" or scales is None or scales.op_type != "Mul":
                raise FloatGraphError(f"{n.name}: its scale is not the product of the input and weight scales")
            w_scale = next((s for s in scales.input if s in inits), None)
            if w_scale is None:
                raise FloatGraphError(f"{n.name}: no weight scale initializer")
            new_nodes.append(helper.make_node("MatMul", [float_input(x_q), dq(w_q, w_scale, w_zero)],
                                              list(mul.output), name=(n.name or "MatMul") + "_float"))
            replaced.update({id(n), id(cast), id(mul)})
    kept = [n for n in g.node if id(n) not in replaced]
    del g.node[:]
    g.node.extend(_live(kept + new_nodes, [o.name for o in g.output]))
    if any(n.op_type in ("DynamicQuantizeLinear", "MatMulInteger", "QAttention", "QEmbedLayerNormalization")
           for n in g.node):
        raise FloatGraphError("quantized ops left after the rewrite")
    used = {i for n in g.node for i in n.input}
    live_inits = [t for t in g.initializer if t.name in used]
    del g.initializer[:]
    g.initializer.extend(live_inits)
    return _sorted(m)


def _attr(node: Any, name: str, default: Any) -> Any:
    from onnx import helper

    return next((helper.get_attribute_value(a) for a in node.attribute if a.name == name), default)


def _live(nodes: list[Any], outputs: list[str]) -> list[Any]:
    """The nodes the graph outputs depend on."""
    producer = {o: n for n in nodes for o in n.output}
    live: dict[int, Any] = {}
    todo = list(outputs)
    while todo:
        n = producer.get(todo.pop())
        if n is not None and id(n) not in live:
            live[id(n)] = n
            todo.extend(i for i in n.input if i)
    return [n for n in nodes if id(n) in live]


def _sorted(model: Any) -> Any:
    """Nodes in topological order (the rewritten ones were appended at the end)."""
    g = model.graph
    ready = {i.name for i in g.input} | {t.name for t in g.initializer} | {""}
    pending, order = list(g.node), []
    while pending:
        progress = [n for n in pending if all(i in ready for i in n.input)]
        if not progress:
            raise FloatGraphError("the rewritten graph has a cycle or a missing input")
        for n in progress:
            order.append(n)
            ready.update(n.output)
        done = {id(n) for n in progress}
        pending = [n for n in pending if id(n) not in done]
    del g.node[:]
    g.node.extend(order)
    return model


def float_graph_bytes(path: str | Path) -> bytes:
    """The float twin of the graph at `path`, serialized (what the runtime hands onnxruntime on CUDA)."""
    import onnx

    return float_graph(onnx.load(str(path))).SerializeToString()
