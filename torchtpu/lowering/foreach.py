"""``_foreach_*`` ops (what SGD/Adam/AdamW run on non-CPU devices): one program per call over every
tensor of the list, built from the element op's rule. Generated from the schemas, not listed by hand."""

from __future__ import annotations

import torch

from ..tables import FOREACH, RULES

# foreach overload -> element overload suffix, in order of preference
_ELEMENT = {
    "List": ("Tensor", "default"),
    "Tensor": ("Tensor", "default"),
    "Scalar": ("Scalar", "default"),
    "ScalarList": ("Scalar", "default"),
    "default": ("default",),
}


def _element_rule(base, ov):
    for suffix in _ELEMENT.get(ov, ()):
        name = base if suffix == "default" else f"{base}.{suffix}"
        if name in RULES:
            return name, RULES[name]
    return None, None


def _foreach_rule(elem_name, elem_rule, list_positions):
    def rule(tr, *args, **kwargs):
        outs = []
        for i in range(len(args[0])):
            el_args = [a[i] if p in list_positions else a for p, a in enumerate(args)]
            outs.append(elem_rule(tr.with_out(tr.out[i]), *el_args, **kwargs))
        return tuple(outs)

    rule.__name__ = f"foreach[{elem_name}]"
    return rule


def _register():
    names = {
        n.split("::")[1].split(".")[0] for n in torch._C._dispatch_get_all_op_names() if n.startswith("aten::_foreach_")
    }
    for packet_name in sorted(names):
        if packet_name.endswith("_"):
            continue
        base = packet_name[len("_foreach_") :]
        packet = getattr(torch.ops.aten, packet_name)
        for ov in packet.overloads():
            schema = getattr(packet, ov)._schema
            if any(a.is_out for a in schema.arguments) or str(schema.arguments[0].type) != "List[Tensor]":
                continue
            if ov == "Tensor" and base in ("addcmul", "addcdiv"):
                continue  # `scalars` is a tensor of per-element values (capturable optimizers): not yet
            elem_name, elem_rule = _element_rule(base, ov)
            if elem_rule is None:
                continue
            lists = {i for i, a in enumerate(schema.arguments) if str(a.type).startswith("List[")}
            name = packet_name if ov == "default" else f"{packet_name}.{ov}"
            FOREACH[name] = _foreach_rule(elem_name, elem_rule, lists)


_register()
