"""Helpers of tests/test_model_parity.py that other tests share."""

from __future__ import annotations



VOCAB, WINDOW, SEQ = 128, 16, 40
COMMON = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, head_dim=16, max_position_embeddings=256, initializer_range=0.2,
              rms_norm_eps=1e-5, attn_implementation="eager")
