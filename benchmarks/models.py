"""Shared benchmark models: a small transformer classifier and its training step.

Same structure as the toy training step the interop dumps were made with (token embedding, pre-norm
attention blocks with a GELU MLP, dropout, mean pooling, cross-entropy, backward, SGD with
``foreach=False``), written for the benchmarks. Two sizes are used:

* ``small``: 2 blocks, about 100 recorded API calls per training step (forward, backward and optimizer);
* ``large``: 45 blocks, about 2,000 recorded API calls per training step.

Shapes: batch 8, sequence 16, d_model 64, 4 heads, vocabulary 128, 10 classes. Everything runs on one
CPU thread (``torch.set_num_threads(1)``) so timings do not depend on how busy the other cores are.

The module imports only torch, so the msprobe side of the benchmark can load it in an interpreter that
does not have msprobe_nb installed.
"""
from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

SIZES = {"small": 2, "large": 45}
BATCH, SEQ, D_MODEL, HEADS, VOCAB, CLASSES = 8, 16, 64, 4, 128, 10
P_DROP = 0.1
SEED = 1234


class Attention(nn.Module):
    """Multi-head self-attention written out with matmul / softmax, as the toy model does."""

    def __init__(self, d_model: int, n_heads: int, p_drop: float):
        super().__init__()
        self.n_heads = n_heads
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.out = nn.Linear(d_model, d_model)
        self.drop = nn.Dropout(p_drop)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        h = self.n_heads
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        q = q.reshape(b, t, h, d // h).transpose(1, 2)
        k = k.reshape(b, t, h, d // h).transpose(1, 2)
        v = v.reshape(b, t, h, d // h).transpose(1, 2)
        scores = torch.matmul(q, k.transpose(-2, -1)) * (1.0 / math.sqrt(d // h))
        scores = scores.to(torch.float32)
        weights = self.drop(torch.softmax(scores, dim=-1))
        ctx = torch.matmul(weights, v).transpose(1, 2).reshape(b, t, d)
        return self.drop(self.out(ctx))


class Layer(nn.Module):
    """Pre-norm transformer layer: x + attn(ln(x)), then x + mlp(ln(x)) with an exact GELU."""

    def __init__(self, d_model: int, n_heads: int, p_drop: float):
        super().__init__()
        self.norm1 = nn.LayerNorm(d_model)
        self.attn = Attention(d_model, n_heads, p_drop)
        self.norm2 = nn.LayerNorm(d_model)
        self.up = nn.Linear(d_model, 4 * d_model)
        self.down = nn.Linear(4 * d_model, d_model)
        self.drop = nn.Dropout(p_drop)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm1(x))
        y = F.gelu(self.up(self.norm2(x)))
        return x + self.drop(self.down(y))


class Classifier(nn.Module):
    """Embedding, ``n_layers`` transformer layers, final norm, mean over the sequence, linear head."""

    def __init__(self, n_layers: int, vocab: int = VOCAB, d_model: int = D_MODEL, n_heads: int = HEADS,
                 n_classes: int = CLASSES, p_drop: float = P_DROP):
        super().__init__()
        self.embed = nn.Embedding(vocab, d_model)
        self.layers = nn.ModuleList([Layer(d_model, n_heads, p_drop) for _ in range(n_layers)])
        self.norm = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, n_classes)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)
        for layer in self.layers:
            x = layer(x)
        return self.head(self.norm(x).mean(dim=1))


@dataclass
class Workload:
    """A model, its optimizer and a deterministic batch source."""

    name: str
    model: Classifier
    optimizer: torch.optim.Optimizer
    make_batch: Callable[[], tuple[torch.Tensor, torch.Tensor]]

    def step(self) -> torch.Tensor:
        tokens, labels = self.make_batch()
        return train_step(self.model, self.optimizer, tokens, labels)


def build(size: str = "small", seed: int = SEED, threads: int = 1) -> Workload:
    """The ``small`` (2 layers) or ``large`` (45 layers) workload; same seed, same weights and batches."""
    if threads:
        torch.set_num_threads(threads)
    n_layers = SIZES[size] if isinstance(size, str) else int(size)
    torch.manual_seed(seed)
    model = Classifier(n_layers)
    model.train()
    opt = torch.optim.SGD(model.parameters(), lr=1e-2, foreach=False)
    gen = torch.Generator().manual_seed(seed + 1)

    def make_batch() -> tuple[torch.Tensor, torch.Tensor]:
        tokens = torch.randint(0, VOCAB, (BATCH, SEQ), generator=gen)
        labels = torch.randint(0, CLASSES, (BATCH,), generator=gen)
        return tokens, labels

    return Workload(f"{size}" if isinstance(size, str) else f"{n_layers} layers", model, opt, make_batch)


def train_step(model: nn.Module, opt: torch.optim.Optimizer, tokens: torch.Tensor,
               labels: torch.Tensor) -> torch.Tensor:
    """One training step: zero grads, forward, cross-entropy, backward, SGD update."""
    opt.zero_grad(set_to_none=True)
    logits = model(tokens)
    loss = F.cross_entropy(logits, labels)
    loss.backward()
    opt.step()
    return loss.detach()
