"""A Mistral-7B-v0.3-shaped GGUF with random weights and the real v3 SentencePiece vocabulary (F16), for speed
measurements at the size people run on a CPU (benchmarks/bench_llamacpp.py --model FILE).

    python benchmarks/make_random_gguf.py /work/models/mistral7b-random-f16.gguf
    llama-quantize /work/models/mistral7b-random-f16.gguf /work/models/mistral7b-random-q4_k_m.gguf Q4_K_M
    # likewise Q8_0, Q4_0, Q5_K_M (llama-quantize: built from the llama-cpp-python sdist, see bench_llamacpp.py;
    # with only libllama built: benchmarks/native/llama_quantize.c, FTYPE 15 = Q4_K_M)
    # --layers 4: the same matrices, 4 decoder layers (2.3 GB F16; quantizing all 32 took > 30 min of a loaded
    # 2-core machine)

Shapes (Mistral-7B-v0.3): 32 layers, hidden 4096, intermediate 14336, 32 query / 8 KV heads of 128, vocabulary
32768 (``mistral_instruct_tokenizer_240323.model.v3`` shipped in ``mistral-common``: pieces, scores and piece
types read from the serialized ModelProto), rope theta 1e6, RMSNorm eps 1e-5, untied output. Weights: normal,
std 0.02 (norm weights 1): every matrix is made of 1 Mi-element runs copied from random offsets of one pool of
64 Mi normal samples (drawing 7 G samples would take minutes of CPU; the speed of a quantized matmul does not
depend on the values), written tensor by tensor (peak memory ~0.5 GB for a 14.5 GB file). llama.cpp's
``llama-quantize`` then makes the quantized files with its own mixes (Q4_K_M: Q4_K with Q6_K for half of
attn_v / ffn_down and the output).
"""

from __future__ import annotations

import sys
from pathlib import Path

import gguf
import numpy as np

LAYERS, DIM, HIDDEN, HEADS, KV_HEADS, HEAD_DIM, VOCAB = 32, 4096, 14336, 32, 8, 128, 32768
POOL, RUN = 1 << 26, 1 << 20  # random pool and run lengths (elements)
SPM_FILE = "mistral_instruct_tokenizer_240323.model.v3"


sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import bench_parser  # noqa: E402


def read_spm(path: Path) -> tuple[list[tuple[str, float, int]], bool]:
    """(piece, score, type) per id, and add_dummy_prefix, of a SentencePiece .model file (read with the
    sentencepiece package's own ModelProto; needs protobuf). The piece types are gguf's TokenType values."""
    from sentencepiece import sentencepiece_model_pb2

    proto = sentencepiece_model_pb2.ModelProto()
    proto.ParseFromString(path.read_bytes())
    pieces = [(p.piece, p.score, p.type) for p in proto.pieces]
    return pieces, proto.normalizer_spec.add_dummy_prefix


def default_spm() -> Path:
    import mistral_common

    path = Path(mistral_common.__file__).parent / "data" / SPM_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{path} missing: install mistral-common, or pass --spm FILE")
    return path


def tensors(layers: int) -> list[tuple[str, tuple[int, ...]]]:
    """(GGUF name, numpy shape [rows, columns]) in llama.cpp's order."""
    out: list[tuple[str, tuple[int, ...]]] = [("token_embd.weight", (VOCAB, DIM))]
    for i in range(layers):
        b = f"blk.{i}."
        out += [(b + "attn_norm.weight", (DIM,)), (b + "attn_q.weight", (HEADS * HEAD_DIM, DIM)),
                (b + "attn_k.weight", (KV_HEADS * HEAD_DIM, DIM)), (b + "attn_v.weight", (KV_HEADS * HEAD_DIM, DIM)),
                (b + "attn_output.weight", (DIM, HEADS * HEAD_DIM)), (b + "ffn_norm.weight", (DIM,)),
                (b + "ffn_gate.weight", (HIDDEN, DIM)), (b + "ffn_up.weight", (HIDDEN, DIM)),
                (b + "ffn_down.weight", (DIM, HIDDEN))]
    out += [("output_norm.weight", (DIM,)), ("output.weight", (VOCAB, DIM))]
    return out


def main() -> None:
    ap = bench_parser(__doc__)
    ap.add_argument("out", type=Path, help="the .gguf to write (F16 matrices, F32 norms)")
    ap.add_argument("--spm", type=Path, default=None,
                    help=f"SentencePiece model (default: mistral-common's {SPM_FILE})")
    ap.add_argument("--layers", type=int, default=LAYERS, help="decoder layers (32: the 7B shape)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    if args.layers < 1:
        raise SystemExit("--layers must be >= 1")
    pieces, add_dummy_prefix = read_spm(args.spm or default_spm())
    if len(pieces) != VOCAB:
        raise SystemExit(f"{args.spm}: {len(pieces)} pieces, the v3 vocabulary has {VOCAB}")

    w = gguf.GGUFWriter(str(args.out), "llama")
    w.add_name("Mistral-7B-v0.3-shaped (random weights)")
    w.add_block_count(args.layers)
    w.add_context_length(32768)
    w.add_embedding_length(DIM)
    w.add_feed_forward_length(HIDDEN)
    w.add_head_count(HEADS)
    w.add_head_count_kv(KV_HEADS)
    w.add_key_length(HEAD_DIM)
    w.add_value_length(HEAD_DIM)
    w.add_rope_dimension_count(HEAD_DIM)
    w.add_rope_freq_base(1e6)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_vocab_size(VOCAB)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    w.add_tokenizer_model("llama")
    w.add_tokenizer_pre("default")
    w.add_token_list([p for p, _, _ in pieces])
    w.add_token_scores([s for _, s, _ in pieces])
    w.add_token_types([t for _, _, t in pieces])
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_unk_token_id(0)
    w.add_add_bos_token(True)
    w.add_add_eos_token(False)
    w.add_add_space_prefix(add_dummy_prefix)

    specs = tensors(args.layers)
    for name, shape in specs:
        dtype = np.dtype(np.float32 if len(shape) == 1 else np.float16)
        w.add_tensor_info(name, shape, dtype, int(np.prod(shape)) * dtype.itemsize)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    rng = np.random.default_rng(args.seed)
    pool = (rng.standard_normal(POOL, dtype=np.float32) * 0.02).astype(np.float16)
    for i, (name, shape) in enumerate(specs):
        if len(shape) == 1:
            w.write_tensor_data(np.ones(shape, np.float32))
        else:
            v = np.empty(int(np.prod(shape)), np.float16)
            for s in range(0, v.size, RUN):
                n = min(RUN, v.size - s)
                o = int(rng.integers(0, POOL - n))
                v[s:s + n] = pool[o:o + n]
            w.write_tensor_data(v.reshape(shape))
            del v
        print(f"\r{i + 1}/{len(specs)} {name}", end="", flush=True)
    w.close()
    print(f"\nwrote {args.out} ({args.out.stat().st_size / 1e9:.2f} GB)")


if __name__ == "__main__":
    main()
