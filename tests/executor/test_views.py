"""Views are metadata over shared storage: reads and writes through any view behave as on CPU."""

import pytest
import torch
from conftest import assert_same


def pair(*shape, dtype=torch.float32):
    x = torch.arange(float(torch.Size(shape).numel())).reshape(shape).to(dtype)
    return x, x.to("tpu")


VIEWS = {
    "transpose": lambda x: x.transpose(0, 1),
    "t_slice": lambda x: x[1:, ::2],
    "select": lambda x: x[1],
    "select_col": lambda x: x[:, 2],
    "expand": lambda x: x[:1].expand(3, 4),
    "as_strided": lambda x: x.as_strided((2, 2), (1, 4), 1),
    "unsqueeze": lambda x: x.unsqueeze(1),
    "view": lambda x: x.view(4, 3),
    "reshape_t": lambda x: x.t().reshape(12),
    "diagonal": lambda x: x.diagonal(),
    "diagonal_off": lambda x: x.diagonal(1),
    "permute_step": lambda x: x[::2, 1::2].t(),
    "unfold": lambda x: x.reshape(12).unfold(0, 4, 2),
    "narrow": lambda x: x.narrow(1, 1, 2),
}


@pytest.mark.parametrize("name", sorted(VIEWS))
def test_read_through_view(name):
    x, t = pair(3, 4)
    assert_same(VIEWS[name](x).clone(), VIEWS[name](t).clone())
    assert_same(VIEWS[name](x) * 2, VIEWS[name](t) * 2)


WRITABLE = [
    "transpose",
    "t_slice",
    "select",
    "select_col",
    "as_strided",
    "unsqueeze",
    "view",
    "diagonal",
    "diagonal_off",
    "permute_step",
    "narrow",
]


@pytest.mark.parametrize("name", WRITABLE)
def test_write_through_view_visible_in_base_and_aliases(name):
    x, t = pair(3, 4)
    ax, at = x.view(12), t.view(12)  # an alias of the whole storage
    VIEWS[name](x).mul_(-1).add_(100)
    VIEWS[name](t).mul_(-1).add_(100)
    assert_same(x, t)
    assert_same(ax, at)


@pytest.mark.parametrize("name", WRITABLE)
def test_copy_into_view_from_cpu_and_tpu(name):
    x, t = pair(3, 4)
    src = torch.full(VIEWS[name](x).shape, 7.0)
    VIEWS[name](x).copy_(src)
    VIEWS[name](t).copy_(src)  # cpu -> tpu view
    assert_same(x, t)
    VIEWS[name](x).copy_(src * 2)
    VIEWS[name](t).copy_(src.to("tpu") * 2)  # tpu -> tpu view
    assert_same(x, t)


@pytest.mark.parametrize(
    "view",
    [
        lambda x: x.view(2, 3, 4).permute(2, 0, 1),  # every element, permuted
        lambda x: x[3:].view(3, 7)[:, 1:5].t(),  # a box from an offset
        lambda x: x.view(4, 6)[1:, ::2].permute(1, 0),  # strided inside the box
        lambda x: x[:20].view(4, 5).diagonal(),  # the box runs past the view's last row
    ],
)
def test_writes_through_permuted_and_boxed_views(view):
    x, t = torch.arange(24.0), torch.arange(24.0).to("tpu")
    src = torch.randn(view(x).shape)
    view(x).copy_(src)
    view(t).copy_(src.to("tpu"))
    assert_same(x, t)
    view(x).mul_(3)
    view(t).mul_(3)
    assert_same(x, t)


def test_out_variants_and_resize():
    a, b = torch.randn(3, 4), torch.randn(3, 4)
    out_c, out_t = torch.empty(0), torch.empty(0, device="tpu")
    torch.add(a, b, out=out_c)
    torch.add(a.to("tpu"), b.to("tpu"), out=out_t)
    assert out_t.shape == (3, 4)
    assert_same(out_c, out_t)
    big = torch.empty(2, 3, device="tpu")
    torch.mul(a.to("tpu"), 2, out=big)  # out= of the wrong shape is resized
    assert_same(a * 2, big)
    torch.sum(a.to("tpu"), dim=1, out=big)
    assert_same(a.sum(1), big)


def test_resize_keeps_prefix_and_set_():
    x, t = pair(2, 3)
    t.resize_(4, 3)
    x.resize_(4, 3)
    assert_same(x[:2], t[:2])
    s = torch.empty(0, device="tpu")
    s.set_(t.untyped_storage(), 1, (2, 2), (1, 2))
    sc = torch.empty(0)
    sc.set_(x.untyped_storage(), 1, (2, 2), (1, 2))
    assert_same(sc, s)
    s.fill_(-1)  # writes through set_ are seen by the tensor sharing the storage
    sc.fill_(-1)
    assert_same(x[:2], t[:2])
    u = torch.ones(4, device="tpu")
    u.untyped_storage().resize_(0)  # FSDP2-style free ...
    assert u.untyped_storage().nbytes() == 0
    u.untyped_storage().resize_(16)  # ... and re-allocate
    u.copy_(torch.arange(4.0))
    assert_same(torch.arange(4.0), u)


def test_zero_size_and_0d():
    z, zt = torch.empty(0, 4), torch.empty(0, 4, device="tpu")
    assert_same(z + 1, zt + 1)
    assert_same(z.sum(0), zt.sum(0))
    s, st = torch.tensor(3.0), torch.tensor(3.0, device="tpu")
    assert_same(s * 2, st * 2)
    st.add_(1)
    assert st.item() == 4.0


def test_dtype_view_bitcast():
    x = torch.tensor([1.0, -2.0, 0.5])
    t = x.to("tpu")
    assert_same(x.view(torch.int32), t.view(torch.int32) + 0)
    t.view(torch.int32).add_(1)
    x.view(torch.int32).add_(1)
    assert_same(x, t)


def test_inplace_on_noncontiguous_and_aliasing_args():
    x, t = pair(4, 4)
    x.add_(x.t().clone())
    t.add_(t.t().clone())
    assert_same(x, t)
    x, t = pair(4, 4)
    x[:, 1:3] = x[:, 0:2].clone()
    t[:, 1:3] = t[:, 0:2].clone()
    assert_same(x, t)
