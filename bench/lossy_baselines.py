"""Re-implementations of two lossy checkpoint compressors, for comparison
with ckptfs's lossy mode in bench/lossy_accuracy.py. numpy only.

Both work on a checkpoint given as a flat dict {key: float32 ndarray} plus
the (weight, exp_avg, exp_avg_sq) key triples of Adam's state, keep a
closed-loop reference (the previous *reconstruction*, so quantization error
does not accumulate) and return the reconstructed tensors with the number of
bytes they would store. Facts taken from the papers (see
/work/shared/notes/papers.md, sections 2 and 3):

LC-Checkpoint (Chen et al., ICML 2020, arXiv 2009.13003), Algorithm 1:
  delta_t = u_t - u~_{t-1}; quantize delta_t; Huffman-code it; save;
  u~_t = u~_{t-1} + delta~_t. Quantization is "exponent-based": entries are
  bucketed by (sign, exponent of frexp), each bucket is represented by the
  mean of its entries, and "priority promotion" keeps only the 2^n - 1
  buckets of largest |value| (all other entries become 0). The bucket
  indices are Huffman-coded. The paper reports up to 28x on small SGD models
  and ships no code; the bucket details follow the third-party
  re-implementations the notes cite.
  Choices made here: the paper's u is the model vector (it had no optimizer
  state); we apply Algorithm 1 to *every* float tensor (weights, Adam's m and
  v), one bucket set per tensor (a single set over all of them would zero
  Adam's v, whose scale is ~1e-8, entirely). The size is the real Huffman
  code length (heapq) of the indices plus a table of 5 bytes per used symbol
  (fp32 representative + code length). The first checkpoint is quantized
  against zero: LC-Checkpoint has no lossless keyframe.

ExCP (Li et al., ICML 2024, arXiv 2406.11257; official code
github.com/Gaffey/ExCP, compress_pythia.py):
  residual dW = W_t - W~_{t-1} against the previous reconstruction;
  weight pruning: zero dW where |dW| <= median(|dW|) * min(2.5, alpha /
  sqrt(mean(v))) with v = exp_avg_sq and alpha = 5e-5;
  momentum pruning: keep m = exp_avg only where |m| > beta * mean(|m|)
  (beta = 2) and dW was not pruned; the same mask on v;
  non-uniform quantization: 1-D k-means with 2^4 - 1 = 15 centroids over the
  non-zero values, separately for dW, m and v (m and v are quantized
  directly, not as residuals, as in the official code); index 0 = pruned;
  two 4-bit indices per byte; tensors with <= 15 non-zeros are stored raw;
  then the result is compressed with 7-Zip. The paper reports ~70x on
  Pythia-410M (4.53 GB -> 0.06 GB) with average task score 43.11 -> 42.93.
  Choices made here: k-means is a deterministic exact 1-D Lloyd iteration
  (quantile initialisation, 20 iterations) instead of faiss' randomly
  seeded one; the 7-Zip stage is Python's lzma (LZMA2, preset 6, close to
  7-Zip's default level) over all packed indices and codebooks of a
  checkpoint; codebooks are kept as fp32 (4 bytes per centroid), not fp16 as
  the official code does, because fp16 flushes Adam's v (~1e-8) to zero,
  which would make resumed training diverge for a reason unrelated to the
  method (the cost is 30 bytes per tensor and stream). Floats without an
  optimizer state get the residual quantization without pruning. The first
  checkpoint is quantized against zero, as for LC-Checkpoint.

Both: tensors with fewer than `exact_below` elements (e.g. Adam's 'step')
and non-float tensors are kept exact and counted at their raw size; the
caller adds the pickle metadata (bench/lossy_accuracy.py counts it as the
zstd -3 size of the torch.save pickle).
"""
import heapq
import lzma

import numpy as np

FLOAT_KINDS = "f"


# ---- shared pieces -----------------------------------------------------------

def huffman_code_lengths(counts):
    """Code length in bits of each symbol of a Huffman code for `counts`
    (a dict symbol -> occurrences > 0). A lone symbol gets 1 bit."""
    if len(counts) == 1:
        return {next(iter(counts)): 1}
    lengths = dict.fromkeys(counts, 0)
    # (weight, tiebreak, symbols): the tiebreak keeps the merge order, and so
    # the lengths, deterministic.
    heap = [(c, i, [s]) for i, (s, c) in enumerate(sorted(counts.items()))]
    heapq.heapify(heap)
    tiebreak = len(heap)
    while len(heap) > 1:
        c1, _, s1 = heapq.heappop(heap)
        c2, _, s2 = heapq.heappop(heap)
        for s in s1 + s2:
            lengths[s] += 1
        heapq.heappush(heap, (c1 + c2, tiebreak, s1 + s2))
        tiebreak += 1
    return lengths


def kmeans_1d(values, k, iters=20):
    """Exact Lloyd iterations in one dimension: the values are sorted once,
    so each cluster is a contiguous run and its mean comes from prefix sums.
    Quantile initialisation makes it deterministic. Returns (centroids
    sorted ascending, label of each value)."""
    xs = np.sort(values.astype(np.float64))
    n = xs.size
    prefix = np.concatenate(([0.0], np.cumsum(xs)))
    cent = xs[((np.arange(k) + 0.5) / k * n).astype(np.int64)]
    for _ in range(iters):
        edges = np.concatenate(([0], np.searchsorted(xs, (cent[:-1] + cent[1:]) / 2), [n]))
        cnt = np.diff(edges)
        sums = prefix[edges[1:]] - prefix[edges[:-1]]
        new = np.where(cnt > 0, sums / np.maximum(cnt, 1), cent)
        if np.array_equal(new, cent):
            break
        cent = new
    labels = np.searchsorted((cent[:-1] + cent[1:]) / 2, values.astype(np.float64))
    return cent, labels


def pack_nibbles(idx):
    """Two 4-bit indices per byte, as ExCP stores them."""
    idx = idx.astype(np.uint8)
    if idx.size % 2:
        idx = np.append(idx, np.uint8(0))
    return ((idx[0::2] << 4) | idx[1::2]).tobytes()


def is_float(a):
    return a.dtype.kind in FLOAT_KINDS


class Codec:
    """Closed-loop state and the exact handling of small and non-float
    tensors, shared by both baselines. Subclasses implement encode_floats."""

    name = "?"

    def __init__(self, exact_below=1024):
        self.exact_below = exact_below
        self.prev = {}  # key -> previous reconstruction (float32)

    def lossy(self, a):
        return is_float(a) and a.size >= self.exact_below

    def encode(self, tensors, triples):
        """tensors: {key: ndarray}; triples: [(w, m, v)] keys (m, v may be
        None). Returns (reconstruction {key: ndarray}, bytes stored for the
        tensors, details dict)."""
        recon, exact_bytes = {}, 0
        lossy = {}
        for key, a in tensors.items():
            if self.lossy(a):
                lossy[key] = a.astype(np.float32, copy=False)
            else:
                recon[key] = a.copy()
                exact_bytes += a.nbytes
        triples = [t for t in triples if t[0] in lossy]
        out, coded_bytes, info = self.encode_floats(lossy, triples)
        for key, a in out.items():
            recon[key] = a.astype(tensors[key].dtype, copy=False)
        info.update(exact_bytes=exact_bytes, coded_bytes=coded_bytes)
        return recon, exact_bytes + coded_bytes, info

    def reference(self, key, a):
        """u~_{t-1}, zero for the first checkpoint (no lossless keyframe)."""
        ref = self.prev.get(key)
        return np.zeros_like(a) if ref is None or ref.shape != a.shape else ref


# ---- LC-Checkpoint -------------------------------------------------------------

def lc_quantize(delta, n_bits):
    """Exponent-based quantization with priority promotion. Returns the
    quantized delta and the bytes of its Huffman-coded indices plus table."""
    d = delta.ravel()
    _, exp = np.frexp(d)
    nonzero = d != 0
    # Bucket key = (exponent, sign); frexp exponents of float32 lie in
    # [-148, 129], so an offset makes the key a small non-negative int.
    key = (exp.astype(np.int64) + 160) * 2 + (d < 0)
    key_nz = key[nonzero]
    counts = np.bincount(key_nz)
    sums = np.bincount(key_nz, weights=d[nonzero].astype(np.float64))
    present = np.flatnonzero(counts)
    means = sums[present] / counts[present]
    keep = present[np.argsort(-np.abs(means), kind="stable")[: 2 ** n_bits - 1]]
    # Symbol 0 = zero (pruned or exactly zero); kept buckets get 1..2^n-1.
    symbol_of_key = np.zeros(counts.size, np.int64)
    symbol_of_key[keep] = np.arange(1, keep.size + 1)
    reps = np.zeros(keep.size + 1, np.float32)
    reps[1:] = (sums[keep] / counts[keep]).astype(np.float32)
    symbols = np.zeros(d.size, np.int64)
    symbols[nonzero] = symbol_of_key[key_nz]
    sym_counts = np.bincount(symbols, minlength=keep.size + 1)
    used = {s: int(c) for s, c in enumerate(sym_counts) if c}
    lengths = huffman_code_lengths(used)
    bits = sum(c * lengths[s] for s, c in used.items())
    nbytes = (bits + 7) // 8 + 5 * len(used)
    return reps[symbols].reshape(delta.shape), nbytes


class LCCheckpoint(Codec):
    name = "LC-Checkpoint"

    def __init__(self, n_bits=3, exact_below=1024):
        super().__init__(exact_below)
        self.n_bits = n_bits

    @property
    def setting(self):
        return f"n={self.n_bits}"

    def encode_floats(self, tensors, triples):
        out, total = {}, 0
        for key, u in tensors.items():
            ref = self.reference(key, u)
            q, nbytes = lc_quantize(u - ref, self.n_bits)
            out[key] = ref + q
            total += nbytes
        self.prev = {k: v for k, v in out.items()}
        return out, total, {}


# ---- ExCP ---------------------------------------------------------------------

def excp_quantize(x, bits=4):
    """Index 0 for zeros, k-means indices 1..2^bits-1 for the rest. Returns
    (reconstruction, payload bytes before the lzma stage)."""
    flat = x.ravel()
    nz = np.flatnonzero(flat)
    k = 2 ** bits - 1
    if nz.size <= k:  # the official code stores such tensors raw
        return x.copy(), flat.astype(np.float32).tobytes()
    cent, labels = kmeans_1d(flat[nz], k)
    cent = cent.astype(np.float32)
    idx = np.zeros(flat.size, np.uint8)
    idx[nz] = labels + 1
    recon = np.concatenate(([np.float32(0)], cent))[idx]
    return recon.reshape(x.shape), pack_nibbles(idx) + cent.tobytes()


def excp_prune_weights(dw, v, alpha):
    """|dW| <= median(|dW|) * min(2.5, alpha / sqrt(mean(v))) becomes 0."""
    if v is None:
        return dw
    factor = min(2.5, alpha / max(float(np.sqrt(v.astype(np.float64).mean())), 1e-30))
    thr = float(np.median(np.abs(dw))) * factor
    return np.where(np.abs(dw) > thr, dw, np.float32(0))


def excp_prune_moments(m, v, dw_pruned, beta):
    """Keep m (and v) where |m| > beta * mean(|m|) and dW survived."""
    mask = (np.abs(m) > beta * np.abs(m).astype(np.float64).mean()) & (dw_pruned != 0)
    zero = np.float32(0)
    return np.where(mask, m, zero), (np.where(mask, v, zero) if v is not None else None)


class ExCP(Codec):
    name = "ExCP"

    def __init__(self, alpha=5e-5, beta=2.0, bits=4, exact_below=1024, lzma_preset=6):
        super().__init__(exact_below)
        self.alpha, self.beta, self.bits, self.preset = alpha, beta, bits, lzma_preset

    @property
    def setting(self):
        return f"alpha={self.alpha:g}"

    def encode_floats(self, tensors, triples):
        out, payload = {}, []
        pruned = total = 0
        done = set()
        for w, m, v in triples:
            v_arr = tensors.get(v) if v else None
            ref = self.reference(w, tensors[w])
            dw = excp_prune_weights(tensors[w] - ref, v_arr, self.alpha)
            pruned += int(dw.size - np.count_nonzero(dw))
            total += dw.size
            q, blob = excp_quantize(dw, self.bits)
            out[w] = ref + q
            payload.append(blob)
            done.add(w)
            if m and m in tensors:
                mp, vp = excp_prune_moments(tensors[m], v_arr, dw, self.beta)
                for key, arr in ((m, mp), (v, vp)):
                    if key is None or arr is None:
                        continue
                    out[key], blob = excp_quantize(arr, self.bits)
                    payload.append(blob)
                    done.add(key)
        for key, a in tensors.items():  # floats with no optimizer state
            if key not in done:
                ref = self.reference(key, a)
                q, blob = excp_quantize(a - ref, self.bits)
                out[key] = ref + q
                payload.append(blob)
        self.prev = {k: v for k, v in out.items()}
        stored = len(lzma.compress(b"".join(payload), preset=self.preset))
        return out, stored, {"weights_pruned": pruned / max(total, 1)}
