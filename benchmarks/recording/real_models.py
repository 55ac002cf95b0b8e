"""The real-model workloads of ``bench_real_models.py``: eight Hugging Face / diffusers models, tiny and offline.

Each is built from a config with random weights (nothing is downloaded), small enough for a 2-core machine,
and trained with AdamW: forward, loss, backward, ``step()``. Each exercises something the benchmark's own
models do not: GPT-2 its dropout, Llama activation checkpointing, BERT autocast to bfloat16, T5 an
encoder-decoder, Mixtral a mixture of experts (data-dependent routing), ViT patches, ResNet BatchNorm in
training mode (running statistics updated in place), diffusers' UNet2DModel convolutions, group norms and
attention on a noise-prediction loss.

:func:`build` has the signature of ``models.build`` (name in, :class:`Workload` out), so the recording
benchmark's child process runs these like its own workloads. Only torch, transformers and diffusers are
imported (the msprobe side may lack msprobe_nb).
"""
from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

__all__ = ["MODELS", "Workload", "build"]

SEED = 1234
BATCH, SEQ, VOCAB, CLASSES, IMAGE = 4, 16, 96, 10, 32


@dataclass
class Workload:
    """A model, its optimizer, a deterministic batch source and the model's training step."""

    name: str
    model: nn.Module
    optimizer: torch.optim.Optimizer
    make_batch: Callable[[], tuple[object, torch.Tensor]]
    train_step: Callable[[nn.Module, torch.optim.Optimizer, object, torch.Tensor], torch.Tensor]


def _lm_step(model, opt, ids, labels):
    """Causal LM / seq2seq: the model's own loss on ``labels``."""
    opt.zero_grad(set_to_none=True)
    loss = model(input_ids=ids, labels=labels).loss
    loss.backward()
    opt.step()
    return loss.detach()


def _autocast_step(model, opt, ids, labels):
    """BERT classification with forward and loss under CPU autocast to bfloat16."""
    opt.zero_grad(set_to_none=True)
    with torch.autocast(device_type=ids.device.type, dtype=torch.bfloat16):
        logits = model(input_ids=ids).logits
        loss = F.cross_entropy(logits.float(), labels)
    loss.backward()
    opt.step()
    return loss.detach()


def _image_step(model, opt, pixels, labels):
    opt.zero_grad(set_to_none=True)
    loss = F.cross_entropy(model(pixel_values=pixels).logits, labels)
    loss.backward()
    opt.step()
    return loss.detach()


def _unet_step(model, opt, batch, noise):
    """Noise prediction: the UNet sees a noised sample and its timesteps, MSE against the noise."""
    sample, timesteps = batch
    opt.zero_grad(set_to_none=True)
    loss = F.mse_loss(model(sample + noise, timesteps).sample, noise)
    loss.backward()
    opt.step()
    return loss.detach()


def _gpt2():
    import transformers as tf
    return tf.GPT2LMHeadModel(tf.GPT2Config(n_layer=2, n_head=2, n_embd=32, vocab_size=VOCAB, n_positions=SEQ,
                                            resid_pdrop=0.1, embd_pdrop=0.1, attn_pdrop=0.1,
                                            bos_token_id=0, eos_token_id=0))


def _llama():
    import transformers as tf
    m = tf.LlamaForCausalLM(tf.LlamaConfig(num_hidden_layers=2, hidden_size=32, intermediate_size=64,
                                           num_attention_heads=2, num_key_value_heads=1, vocab_size=VOCAB,
                                           max_position_embeddings=SEQ, use_cache=False))
    if hasattr(m, "activation_checkpointing_enable"):  # transformers 5's name; the old one warns there
        m.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
    else:
        m.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    return m


def _bert():
    import transformers as tf
    return tf.BertForSequenceClassification(tf.BertConfig(num_hidden_layers=2, hidden_size=32, intermediate_size=64,
                                                          num_attention_heads=2, vocab_size=VOCAB,
                                                          max_position_embeddings=SEQ, num_labels=CLASSES))


def _t5():
    import transformers as tf
    return tf.T5ForConditionalGeneration(tf.T5Config(num_layers=2, num_decoder_layers=2, d_model=32, d_ff=64,
                                                     d_kv=16, num_heads=2, vocab_size=VOCAB, pad_token_id=0,
                                                     decoder_start_token_id=0, eos_token_id=1))


def _mixtral():
    import transformers as tf
    return tf.MixtralForCausalLM(tf.MixtralConfig(num_hidden_layers=2, hidden_size=32, intermediate_size=32,
                                                  num_attention_heads=2, num_key_value_heads=1, vocab_size=VOCAB,
                                                  num_local_experts=4, num_experts_per_tok=2,
                                                  max_position_embeddings=SEQ, use_cache=False))


def _vit():
    import transformers as tf
    return tf.ViTForImageClassification(tf.ViTConfig(image_size=IMAGE, patch_size=8, num_channels=3, hidden_size=32,
                                                     num_hidden_layers=2, num_attention_heads=2,
                                                     intermediate_size=64, num_labels=CLASSES))


def _resnet():
    import transformers as tf
    return tf.ResNetForImageClassification(tf.ResNetConfig(num_channels=3, embedding_size=16, hidden_sizes=[16, 32],
                                                           depths=[1, 1], layer_type="basic", num_labels=CLASSES))


def _unet():
    import diffusers
    return diffusers.UNet2DModel(sample_size=8, in_channels=3, out_channels=3, layers_per_block=1,
                                 block_out_channels=(16, 32), norm_num_groups=8,
                                 down_block_types=("DownBlock2D", "AttnDownBlock2D"),
                                 up_block_types=("AttnUpBlock2D", "UpBlock2D"))


def _tokens(gen):
    ids = torch.randint(2, VOCAB, (BATCH, SEQ), generator=gen)
    return ids, ids.clone()


def _token_labels(gen):
    return torch.randint(2, VOCAB, (BATCH, SEQ), generator=gen), torch.randint(0, CLASSES, (BATCH,), generator=gen)


def _images(gen):
    return torch.randn(BATCH, 3, IMAGE, IMAGE, generator=gen), torch.randint(0, CLASSES, (BATCH,), generator=gen)


def _noised(gen):
    sample = torch.randn(BATCH, 3, 8, 8, generator=gen)
    return (sample, torch.randint(0, 1000, (BATCH,), generator=gen)), torch.randn(BATCH, 3, 8, 8, generator=gen)


#: name -> (model builder, batch maker, training step)
MODELS = {
    "gpt2": (_gpt2, _tokens, _lm_step),
    "llama": (_llama, _tokens, _lm_step),
    "bert": (_bert, _token_labels, _autocast_step),
    "t5": (_t5, _tokens, _lm_step),
    "mixtral": (_mixtral, _tokens, _lm_step),
    "vit": (_vit, _images, _image_step),
    "resnet": (_resnet, _images, _image_step),
    "unet": (_unet, _noised, _unet_step),
}


def build(name: str, seed: int = SEED, threads: int = 1, foreach: bool = False) -> Workload:
    """The workload ``name`` (a key of :data:`MODELS`); same seed, same weights and batches. ``foreach``: AdamW's
    multi-tensor path (a few ``_foreach_*`` calls a step, the default on GPUs and NPUs) rather than its loop over
    the parameters (a handful of calls per parameter, the default on CPUs)."""
    if name not in MODELS:
        raise ValueError(f"unknown real model {name!r}; expected one of {', '.join(MODELS)}")
    if threads:
        torch.set_num_threads(threads)
    make_model, make_batch, step = MODELS[name]
    torch.manual_seed(seed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the libraries' notes about configs and checkpointing
        model = make_model()
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=foreach)
    gen = torch.Generator().manual_seed(seed + 1)
    return Workload(name, model, opt, lambda: make_batch(gen), step)
