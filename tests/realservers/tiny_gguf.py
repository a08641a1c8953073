"""Write a tiny llama-architecture GGUF with random weights: ``python tiny_gguf.py OUT.gguf``.

Run by the servers' Python (it needs the ``gguf`` package and numpy, which the test venv does
not carry). The model is a few hundred KB: 2 layers, width 64, a SentencePiece-style vocabulary
of the three control tokens, the 256 byte tokens and the printable ASCII characters (``▁`` for
the space), so any ASCII prompt tokenizes to characters.

The weights are random (a fixed seed: the same file every time) but shaped so the model is
usable in tests: the residual stream carries a large constant in dimension 0, and the output
rows of the control and byte tokens weigh it negatively, so the model never ends its answer by
itself (every stop is ``max_tokens`` / ``length``) and never emits bytes that are not UTF-8.
The other logits are spread widely, so greedy decoding is stable and sampling at a high
temperature visibly changes the text.
"""

from __future__ import annotations

import sys

import gguf
import numpy as np

WIDTH = 64
LAYERS = 2
HEADS = 4
FFN = 128
SEED = 20261202


def vocabulary() -> tuple[list[str], list[float], list[int]]:
    """Tokens, scores and types: <unk> <s> </s>, 256 byte tokens, printable ASCII."""
    tokens = ["<unk>", "<s>", "</s>"]
    types = [gguf.TokenType.UNKNOWN, gguf.TokenType.CONTROL, gguf.TokenType.CONTROL]
    tokens += [f"<0x{b:02X}>" for b in range(256)]
    types += [gguf.TokenType.BYTE] * 256
    chars = ["\u2581" if c == " " else c for c in map(chr, range(32, 127))]
    tokens += chars
    types += [gguf.TokenType.NORMAL] * len(chars)
    scores = [0.0] * len(tokens)
    return tokens, scores, [int(t) for t in types]


def weights(n_vocab: int, first_normal: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(SEED)

    def small(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape) * 0.02).astype(np.float32)

    embd = rng.standard_normal((n_vocab, WIDTH)).astype(np.float32)
    embd[:, 0] = 8.0  # the constant the output rows below read
    out = rng.standard_normal((n_vocab, WIDTH)).astype(np.float32)
    out[:, 0] = 1.0
    out[:first_normal, :] = 0.0
    out[:first_normal, 0] = -4.0  # control and byte tokens: never the likeliest
    tensors = {
        "token_embd.weight": embd,
        "output_norm.weight": np.ones(WIDTH, dtype=np.float32),
        "output.weight": out,
    }
    for i in range(LAYERS):
        tensors |= {
            f"blk.{i}.attn_norm.weight": np.ones(WIDTH, dtype=np.float32),
            f"blk.{i}.attn_q.weight": small(WIDTH, WIDTH),
            f"blk.{i}.attn_k.weight": small(WIDTH, WIDTH),
            f"blk.{i}.attn_v.weight": small(WIDTH, WIDTH),
            f"blk.{i}.attn_output.weight": small(WIDTH, WIDTH),
            f"blk.{i}.ffn_norm.weight": np.ones(WIDTH, dtype=np.float32),
            f"blk.{i}.ffn_gate.weight": small(FFN, WIDTH),
            f"blk.{i}.ffn_up.weight": small(FFN, WIDTH),
            f"blk.{i}.ffn_down.weight": small(WIDTH, FFN),
        }
    return tensors


def write(path: str, context_length: int = 4096) -> None:
    tokens, scores, types = vocabulary()
    writer = gguf.GGUFWriter(path, "llama")
    writer.add_name("ai-lease-tiny")
    writer.add_context_length(context_length)
    writer.add_embedding_length(WIDTH)
    writer.add_block_count(LAYERS)
    writer.add_feed_forward_length(FFN)
    writer.add_head_count(HEADS)
    writer.add_head_count_kv(HEADS)
    writer.add_rope_dimension_count(WIDTH // HEADS)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    writer.add_tokenizer_model("llama")
    writer.add_token_list(tokens)
    writer.add_token_scores(scores)
    writer.add_token_types(types)
    writer.add_unk_token_id(0)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    for name, tensor in weights(len(tokens), 3 + 256).items():
        writer.add_tensor(name, tensor)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


if __name__ == "__main__":
    write(sys.argv[1])
