"""Triton kernels of the fused network (streamcorr.estimate.fused): one transformer block over a tile of pairs,
a pair's unsmoothed table by rows, a pair's smoother and DV read-out, and a pair's whole tail in one.

Imported only where the fused path runs (CUDA, or the CPU interpreter under ``TRITON_INTERPRET=1``), so that
a CPU process never pays for importing Triton.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _tile(ptr, row0, col0, ld, ROWS: tl.constexpr, COLS: tl.constexpr):
    """M[row0:row0+ROWS, col0:col0+COLS] of a row-major matrix with leading dimension ld."""
    r = tl.arange(0, ROWS)
    c = tl.arange(0, COLS)
    return tl.load(ptr + (row0 + r)[:, None] * ld + (col0 + c)[None, :])


@triton.jit
def _vec(ptr, off, N: tl.constexpr):
    return tl.load(ptr + off + tl.arange(0, N))


@triton.jit
def _layer_norm(x, w_ptr, b_ptr, D: tl.constexpr, eps):
    mean = tl.sum(x, 1) / D
    xc = x - mean[:, None]
    var = tl.sum(xc * xc, 1) / D
    return xc / tl.sqrt(var + eps)[:, None] * _vec(w_ptr, 0, D)[None, :] + _vec(b_ptr, 0, D)[None, :]


@triton.jit
def _gelu(x):
    return 0.5 * x * (1.0 + tl.erf(x * 0.7071067811865476))


@triton.jit
def _block_kernel(
    x_ptr, c_ptr, o_ptr, n_rows,
    lnx_w, lnx_b, lnc_w, lnc_b, wq, bq, wkv, bkv, wo, bo, lnf_w, lnf_b, w1, b1, w2, b2,
    eps, scale, lnz_w, lnz_b, eps_z,
    HAS_CTX: tl.constexpr, FINAL_LN: tl.constexpr, R: tl.constexpr, SEQ: tl.constexpr, D: tl.constexpr,
    H: tl.constexpr, F: tl.constexpr, DOT: tl.constexpr,
):  # fmt: skip
    """One pre-norm block (attention, feed-forward) over R rows = R / SEQ pairs; weights transposed (in, out)."""
    HD: tl.constexpr = D // H
    r = tl.program_id(0).to(tl.int64) * R + tl.arange(0, R)
    live = r < n_rows
    d = tl.arange(0, D)
    x = tl.load(x_ptr + r[:, None] * D + d[None, :], mask=live[:, None], other=0.0)
    xn = _layer_norm(x, lnx_w, lnx_b, D, eps)
    if HAS_CTX:
        c = tl.load(c_ptr + r[:, None] * D + d[None, :], mask=live[:, None], other=0.0)
        cd = _layer_norm(c, lnc_w, lnc_b, D, eps).to(DOT)
    else:
        cd = xn.to(DOT)
    xd = xn.to(DOT)
    # a row attends only to the rows of its own pair: a block-diagonal mask over the tile
    pair = tl.arange(0, R) // SEQ
    same = pair[:, None] == pair[None, :]
    acc = tl.zeros((R, D), tl.float32) + _vec(bo, 0, D)[None, :]
    for h in tl.static_range(H):
        q = tl.dot(xd, _tile(wq, 0, h * HD, D, D, HD).to(DOT)) + _vec(bq, h * HD, HD)[None, :]
        k = tl.dot(cd, _tile(wkv, 0, h * HD, 2 * D, D, HD).to(DOT)) + _vec(bkv, h * HD, HD)[None, :]
        v = tl.dot(cd, _tile(wkv, 0, D + h * HD, 2 * D, D, HD).to(DOT)) + _vec(bkv, D + h * HD, HD)[None, :]
        s = tl.dot(q.to(DOT), tl.trans(k.to(DOT))) * scale
        s = tl.where(same, s, float("-inf"))
        p = tl.exp(s - tl.max(s, 1)[:, None])
        p = p / tl.sum(p, 1)[:, None]
        o = tl.dot(p.to(DOT), v.to(DOT))  # (R, HD)
        acc += tl.dot(o.to(DOT), _tile(wo, h * HD, 0, D, HD, D).to(DOT))
    x = x + acc
    f = tl.dot(_layer_norm(x, lnf_w, lnf_b, D, eps).to(DOT), _tile(w1, 0, 0, F, D, F).to(DOT))
    f = _gelu(f + _vec(b1, 0, F)[None, :])
    x = x + tl.dot(f.to(DOT), _tile(w2, 0, 0, D, F, D).to(DOT)) + _vec(b2, 0, D)[None, :]
    if FINAL_LN:  # the decode block's only reader is the head, after norm_out
        x = _layer_norm(x, lnz_w, lnz_b, D, eps_z)
    tl.store(o_ptr + r[:, None] * D + d[None, :], x.to(o_ptr.dtype.element_ty), mask=live[:, None])


@triton.jit
def _node_weight(w1, k, c, CIN: tl.constexpr):
    return tl.load(w1 + k * CIN + c)


@triton.jit
def _theta_rows(head_ptr, hist, mx_ptr, my_ptr, w1, b1, w2, b2, b, n, r0,
                G: tl.constexpr, P: tl.constexpr, S: tl.constexpr, NH: tl.constexpr, RC: tl.constexpr):  # fmt: skip
    """Rows r0 .. r0 + RC of a pair's unsmoothed table: features and the per-node MLP over 4 head planes."""
    g = tl.arange(0, G)
    ri = r0 + tl.arange(0, RC)
    hc = tl.load(hist + ri[:, None] * G + g[None, :]).to(tl.float32)
    e = tl.load(mx_ptr + b * G + ri)[:, None] * tl.load(my_ptr + b * G + g)[None, :] / n
    resid = (hc - e) / tl.sqrt(e + 1.0)
    sq = tl.where(resid < 0, -1.0, 1.0) * tl.log(tl.abs(resid) + tl.sqrt(resid * resid + 1.0))
    lr = tl.log((hc + 0.5) / (e + 0.5))
    width: tl.constexpr = 4 * P * P  # the head's outputs per token: 4 channel-major planes of one patch
    at = head_ptr + b * S * S * width + ((ri // P) * S)[:, None] * width + (g // P)[None, :] * width
    at += (ri % P)[:, None] * P + (g % P)[None, :]
    p0 = tl.load(at).to(tl.float32)
    p1 = tl.load(at + P * P).to(tl.float32)
    p2 = tl.load(at + 2 * P * P).to(tl.float32)
    p3 = tl.load(at + 3 * P * P).to(tl.float32)
    theta = tl.zeros((RC, G), tl.float32) + tl.load(b2)
    for k in tl.static_range(NH):
        z = tl.load(b1 + k) + _node_weight(w1, k, 0, 6) * p0 + _node_weight(w1, k, 1, 6) * p1
        z += _node_weight(w1, k, 2, 6) * p2 + _node_weight(w1, k, 3, 6) * p3
        z += _node_weight(w1, k, 4, 6) * sq + _node_weight(w1, k, 5, 6) * lr
        theta += tl.load(w2 + k) * _gelu(z)
    return theta


@triton.jit
def _theta_kernel(
    head_ptr, hist_ptr, mx_ptr, my_ptr, w1, b1, w2, b2, theta_ptr,
    G: tl.constexpr, P: tl.constexpr, S: tl.constexpr, NH: tl.constexpr, RC: tl.constexpr,
):  # fmt: skip
    """Unsmoothed tables (B, G, G) fp32, RC rows of one pair per program: grid (B, G / RC)."""
    b = tl.program_id(0).to(tl.int64)
    r0 = tl.program_id(1) * RC
    g = tl.arange(0, G)
    hist = hist_ptr + b * G * G
    n = tl.maximum(tl.sum(tl.load(mx_ptr + b * G + g), 0), 1.0)  # the window's count from its marginal
    theta = _theta_rows(head_ptr, hist, mx_ptr, my_ptr, w1, b1, w2, b2, b, n, r0, G, P, S, NH, RC)
    ri = r0 + tl.arange(0, RC)
    tl.store(theta_ptr + b * G * G + ri[:, None] * G + g[None, :], theta)


@triton.jit
def _tail_kernel(
    head_ptr, hist_ptr, mx_ptr, my_ptr, gate_ptr, s0_ptr, s1_ptr, w1, b1, w2, b2, out_ptr,
    G: tl.constexpr, P: tl.constexpr, S: tl.constexpr, NH: tl.constexpr, RC: tl.constexpr,
    TWO: tl.constexpr, PREC: tl.constexpr,
):  # fmt: skip
    """MI of one pair: features, per-node MLP over 4 head planes, A theta A^T, DV read-out over its histogram."""
    b = tl.program_id(0).to(tl.int64)
    g = tl.arange(0, G)
    hist = hist_ptr + b * G * G
    h = tl.load(hist + g[:, None] * G + g[None, :]).to(tl.float32)
    n = tl.maximum(tl.sum(tl.sum(h, 1), 0), 1.0)
    mx = tl.load(mx_ptr + b * G + g)
    my = tl.load(my_ptr + b * G + g)
    a = 0.0
    if TWO:
        a = tl.load(gate_ptr + b)
    left = tl.zeros((G, G), tl.float32)
    for r0 in tl.static_range(0, G, RC):
        theta = _theta_rows(head_ptr, hist, mx_ptr, my_ptr, w1, b1, w2, b2, b, n, r0, G, P, S, NH, RC)
        # A[:, rows] for A = (1 - a) S0 + a S1
        cols = _tile(s0_ptr, 0, r0, G, G, RC)
        if TWO:
            cols = (1.0 - a) * cols + a * _tile(s1_ptr, 0, r0, G, G, RC)
        left += tl.dot(cols, theta, input_precision=PREC)
    at_ = tl.trans(_tile(s0_ptr, 0, 0, G, G, G))
    if TWO:
        at_ = (1.0 - a) * at_ + a * tl.trans(_tile(s1_ptr, 0, 0, G, G, G))
    sm = tl.dot(left, at_, input_precision=PREC)  # A theta A^T
    first = tl.sum(tl.sum(h * sm, 1), 0) / n
    z = sm + tl.log(tl.maximum(mx / n, 1e-30))[:, None] + tl.log(tl.maximum(my / n, 1e-30))[None, :]
    top = tl.max(tl.max(z, 1), 0)
    tl.store(out_ptr + b, first - top - tl.log(tl.sum(tl.sum(tl.exp(z - top), 1), 0)))


@triton.jit
def _smooth_kernel(
    theta_ptr, hist_ptr, mx_ptr, my_ptr, gate_ptr, s0_ptr, s1_ptr, out_ptr,
    G: tl.constexpr, TWO: tl.constexpr, PREC: tl.constexpr,
):  # fmt: skip
    """MI of one pair from its unsmoothed table: A theta A^T (A = (1 - a) S0 + a S1), DV read-out over its histogram."""
    b = tl.program_id(0).to(tl.int64)
    g = tl.arange(0, G)
    h = tl.load(hist_ptr + b * G * G + g[:, None] * G + g[None, :]).to(tl.float32)
    n = tl.maximum(tl.sum(tl.sum(h, 1), 0), 1.0)
    a_ = _tile(s0_ptr, 0, 0, G, G, G)
    if TWO:
        a = tl.load(gate_ptr + b)
        a_ = (1.0 - a) * a_ + a * _tile(s1_ptr, 0, 0, G, G, G)
    theta = tl.load(theta_ptr + b * G * G + g[:, None] * G + g[None, :])
    left = tl.dot(a_, theta, input_precision=PREC)  # A theta
    sm = tl.dot(left, tl.trans(a_), input_precision=PREC)  # A theta A^T
    first = tl.sum(tl.sum(h * sm, 1), 0) / n
    mx = tl.load(mx_ptr + b * G + g)
    my = tl.load(my_ptr + b * G + g)
    z = sm + tl.log(tl.maximum(mx / n, 1e-30))[:, None] + tl.log(tl.maximum(my / n, 1e-30))[None, :]
    top = tl.max(tl.max(z, 1), 0)
    tl.store(out_ptr + b, first - top - tl.log(tl.sum(tl.sum(tl.exp(z - top), 1), 0)))


@triton.jit
def _embed_kernel(
    hist_ptr, mx_ptr, my_ptr, wt_ptr, b_ptr, pos_ptr, o_ptr,
    G: tl.constexpr, P: tl.constexpr, S: tl.constexpr, D: tl.constexpr, DOT: tl.constexpr,
):  # fmt: skip
    """A pair's tokens (S*S, D) fp32: each patch's input features (squashed Pearson residual, log ratio; P*P nodes
    each) through the embedding (weight transposed (2 P P, D)), plus its bias and the position embedding."""
    b = tl.program_id(0).to(tl.int64)
    t = tl.arange(0, S * S)  # tokens, row-major over patches
    k = tl.arange(0, P * P)  # a patch's nodes, row-major
    row = (t // S)[:, None] * P + (k // P)[None, :]  # (S*S, P*P) node coordinates
    col = (t % S)[:, None] * P + (k % P)[None, :]
    n = tl.maximum(tl.sum(tl.load(mx_ptr + b * G + tl.arange(0, G)), 0), 1.0)
    h = tl.load(hist_ptr + b * G * G + row * G + col).to(tl.float32)
    e = tl.load(mx_ptr + b * G + row) * tl.load(my_ptr + b * G + col) / n
    resid = (h - e) / tl.sqrt(e + 1.0)
    sq = tl.where(resid < 0, -1.0, 1.0) * tl.log(tl.abs(resid) + tl.sqrt(resid * resid + 1.0))
    lr = tl.log((h + 0.5) / (e + 0.5))
    d = tl.arange(0, D)
    w_sq = tl.load(wt_ptr + k[:, None] * D + d[None, :])  # (P*P, D): the squashed channel's rows
    w_lr = tl.load(wt_ptr + (P * P + k)[:, None] * D + d[None, :])
    out = tl.dot(sq.to(DOT), w_sq) + tl.dot(lr.to(DOT), w_lr)  # (S*S, D)
    out += tl.load(b_ptr + d)[None, :] + tl.load(pos_ptr + t[:, None] * D + d[None, :])
    tl.store(o_ptr + b * S * S * D + t[:, None] * D + d[None, :], out)
