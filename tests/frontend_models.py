"""PyTorch models the frontend tests and the GPU demo share: plain PyTorch, nothing of pyrunner."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class DecoderBlock(nn.Module):
    """RMSNorm -> QKV projection -> scaled attention -> output projection -> residual -> RMSNorm -> SwiGLU
    MLP -> residual, on one sequence x[tokens, d]. Head weights are [d, heads, head_dim] (einsum), so no
    view has to split an axis."""

    def __init__(self, d: int = 256, heads: int = 2, head_dim: int = 64, ffn: int = 512, seed: int = 0) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(seed)

        def p(*shape: int, fan_in: int) -> nn.Parameter:
            return nn.Parameter(torch.randn(*shape, generator=g) * fan_in ** -0.5)

        self.norm1 = nn.RMSNorm(d, eps=1e-6)
        self.norm2 = nn.RMSNorm(d, eps=1e-6)
        with torch.no_grad():
            self.norm1.weight.copy_(1 + 0.1 * torch.randn(d, generator=g))
            self.norm2.weight.copy_(1 + 0.1 * torch.randn(d, generator=g))
        self.wq, self.wk, self.wv = (p(d, heads, head_dim, fan_in=d) for _ in range(3))
        self.wo = p(heads, head_dim, d, fan_in=heads * head_dim)
        self.w_gate, self.w_up = p(d, ffn, fan_in=d), p(d, ffn, fan_in=d)
        self.w_down = p(ffn, d, fan_in=ffn)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.norm1(x)
        q = torch.einsum("td,dhk->htk", h, self.wq)
        k = torch.einsum("td,dhk->htk", h, self.wk)
        v = torch.einsum("td,dhk->htk", h, self.wv)
        a = F.scaled_dot_product_attention(q, k, v)
        x = x + torch.einsum("htk,hkd->td", a, self.wo)
        h = self.norm2(x)
        return x + (F.silu(h @ self.w_gate) * (h @ self.w_up)) @ self.w_down


# --- Hugging Face decoder layers, built from config objects with random weights (no downloads) -------------

HF_SEQ = 16
"""Tokens of the small CI shape (one sequence)."""


def _rope(rotary_cls, cfg, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return rotary_cls(cfg)(x, torch.arange(x.shape[1])[None])


def _seeded(layer: nn.Module, seed: int) -> nn.Module:
    """Random weights from a fixed seed; norm scales near 1 (zero-centred for Gemma's 1 + w)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in layer.named_parameters():
            if "norm" in name or "ln_" in name:
                base = 0.0 if float(p.detach().abs().sum()) == 0 else 1.0
                p.copy_(base + 0.1 * torch.randn(p.shape, generator=g))
            else:
                p.copy_(torch.randn(p.shape, generator=g) * p.shape[-1] ** -0.5)
    return layer.eval()


def additive_mask(t: int, window: int | None = None, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """[1, 1, t, t]: 0 where key <= query (and query - window < key), -inf elsewhere."""
    q, k = torch.arange(t)[:, None], torch.arange(t)[None, :]
    keep = (k <= q) if window is None else (k <= q) & (q - window < k)
    return torch.where(keep, 0.0, float("-inf")).to(dtype)[None, None]


def llama_layer(seq: int = HF_SEQ, hidden: int = 64, heads: int = 4, kv_heads: int = 2, head_dim: int = 16,
                ffn: int = 128, seed: int = 0) -> tuple[nn.Module, tuple, dict]:
    """LlamaDecoderLayer: RMSNorm, GQA, RoPE, SwiGLU; sdpa attention (is_causal, enable_gqa)."""
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaRotaryEmbedding

    cfg = LlamaConfig(hidden_size=hidden, intermediate_size=ffn, num_attention_heads=heads,
                      num_key_value_heads=kv_heads, head_dim=head_dim, num_hidden_layers=1, vocab_size=128)
    cfg._attn_implementation = "sdpa"
    x = torch.randn(1, seq, hidden, generator=torch.Generator().manual_seed(seed + 1))
    return (_seeded(LlamaDecoderLayer(cfg, 0), seed), (x,),
            {"attention_mask": None, "position_embeddings": _rope(LlamaRotaryEmbedding, cfg, x)})


def qwen2_layer(seq: int = HF_SEQ, hidden: int = 64, heads: int = 4, kv_heads: int = 2, ffn: int = 128,
                seed: int = 0) -> tuple[nn.Module, tuple, dict]:
    """Qwen2DecoderLayer: Llama's structure with biases on the Q/K/V projections; sdpa attention."""
    from transformers import Qwen2Config
    from transformers.models.qwen2.modeling_qwen2 import Qwen2DecoderLayer, Qwen2RotaryEmbedding

    cfg = Qwen2Config(hidden_size=hidden, intermediate_size=ffn, num_attention_heads=heads,
                      num_key_value_heads=kv_heads, num_hidden_layers=1, vocab_size=128)
    cfg._attn_implementation = "sdpa"
    x = torch.randn(1, seq, hidden, generator=torch.Generator().manual_seed(seed + 1))
    return (_seeded(Qwen2DecoderLayer(cfg, 0), seed), (x,),
            {"attention_mask": None, "position_embeddings": _rope(Qwen2RotaryEmbedding, cfg, x)})


def gpt2_block(seq: int = HF_SEQ, hidden: int = 64, heads: int = 4, seed: int = 0) -> tuple[nn.Module, tuple, dict]:
    """GPT2Block: LayerNorm with bias, fused c_attn (addmm) split into Q/K/V, causal sdpa, GELU-tanh
    written out (``gelu_new``: x ** 3 and tanh)."""
    from transformers import GPT2Config
    from transformers.models.gpt2.modeling_gpt2 import GPT2Block

    cfg = GPT2Config(n_embd=hidden, n_head=heads, n_layer=1, n_positions=max(64, seq), vocab_size=128,
                     activation_function="gelu_new", bos_token_id=0, eos_token_id=0, attn_pdrop=0.0,
                     resid_pdrop=0.0, embd_pdrop=0.0)
    cfg._attn_implementation = "sdpa"
    x = torch.randn(1, seq, hidden, generator=torch.Generator().manual_seed(seed + 1))
    return _seeded(GPT2Block(cfg, layer_idx=0), seed), (x,), {}


def gemma2_layer(seq: int = HF_SEQ, hidden: int = 64, heads: int = 4, kv_heads: int = 2, head_dim: int = 16,
                 ffn: int = 128, window: int = 8, seed: int = 0) -> tuple[nn.Module, tuple, dict]:
    """Gemma2DecoderLayer (a sliding-window layer): logit softcapping (tanh), GELU-tanh GLU, pre and post
    norms, repeat_kv in eager attention, the sliding-window causal mask given as an additive tensor."""
    from transformers import Gemma2Config
    from transformers.models.gemma2.modeling_gemma2 import Gemma2DecoderLayer, Gemma2RotaryEmbedding

    cfg = Gemma2Config(hidden_size=hidden, intermediate_size=ffn, num_attention_heads=heads,
                       num_key_value_heads=kv_heads, head_dim=head_dim, num_hidden_layers=2, vocab_size=128,
                       sliding_window=window, attn_logit_softcapping=50.0, query_pre_attn_scalar=head_dim)
    cfg._attn_implementation = "eager"
    x = torch.randn(1, seq, hidden, generator=torch.Generator().manual_seed(seed + 1))
    layer = Gemma2DecoderLayer(cfg, 0)
    win = window if getattr(layer, "is_sliding", False) or getattr(layer.self_attn, "sliding_window", None) \
        else None
    return (_seeded(layer, seed), (x,),
            {"attention_mask": additive_mask(seq, win), "position_embeddings": _rope(Gemma2RotaryEmbedding, cfg, x)})


HF_BLOCKS = {"llama": llama_layer, "qwen2": qwen2_layer, "gpt2": gpt2_block, "gemma2": gemma2_layer}


def decode_inputs(block: str, x: torch.Tensor, cfg, n: int, seed: int) -> tuple[torch.Tensor, dict]:
    """One decode token at position ``n`` and its keyword inputs (rotary tables at that position)."""
    import importlib

    mod = importlib.import_module(f"transformers.models.{block}.modeling_{block}")
    rotary = getattr(mod, f"{'Llama' if block == 'llama' else 'Qwen2'}RotaryEmbedding")(cfg)
    x1 = torch.randn(1, 1, x.shape[-1], generator=torch.Generator().manual_seed(seed))
    return x1, {"attention_mask": None, "use_cache": True, "position_embeddings": rotary(x1, torch.tensor([[n]]))}


# --- whole causal language models of many architectures (embedding, one layer, final norm, LM head) ----------

CAUSAL_LM_ARCHS = ("llama", "mistral", "qwen2", "qwen3", "phi3", "gemma", "gemma3_text", "gpt_neox", "olmo2",
                   "stablelm", "starcoder2", "granite", "cohere", "phi", "falcon", "opt", "gptj", "codegen", "bloom",
                   "mixtral", "qwen2_moe", "gpt_bigcode", "smollm3", "glm")
"""Hugging Face ``model_type`` names built by ``causal_lm``: the decoder families a user is likely to bring."""

EAGER_ONLY = ("gptj", "codegen", "bloom")
"""Architectures whose transformers classes have no sdpa attention (eager attention, the mask as a tensor)."""

_SIZE_FIELDS = {"n_embd": 64, "n_head": 4, "n_layer": 1, "n_inner": 128, "ffn_dim": 128, "word_embed_proj_dim": 64,
                "head_dim": 16, "rotary_dim": 8}
"""Other spellings of the tiny size, for configs that name it their own way (GPT-J, OPT, BigCode)."""


DROPOUTS = ("attention_dropout", "hidden_dropout", "resid_pdrop", "attn_pdrop", "embd_pdrop", "dropout",
            "activation_dropout", "hidden_dropout_prob", "attention_probs_dropout_prob", "dropout_rate",
            "mlp_dropout", "embedding_dropout")
"""The names configs give their dropout rates: all set to 0, so a training step is deterministic."""


def _no_dropout(cfg) -> None:
    for k in DROPOUTS:
        if hasattr(cfg, k):
            setattr(cfg, k, 0.0)


def causal_lm(arch: str, seq: int = HF_SEQ, seed: int = 0) -> tuple[nn.Module, torch.Tensor]:
    """A one-layer ``AutoModelForCausalLM`` of ``arch`` at hidden 64, 4 heads (2 KV heads where it has GQA),
    vocabulary 128, random weights from ``seed``, no dropout; and ``seq`` token ids."""
    from transformers import AutoConfig, AutoModelForCausalLM

    size = {"hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4, "num_hidden_layers": 1,
            "vocab_size": 128, "max_position_embeddings": 64, "pad_token_id": 0}
    if arch != "gpt_neox":
        size["num_key_value_heads"] = 2
    cfg = AutoConfig.for_model(arch, **size)
    for k, v in _SIZE_FIELDS.items():
        if hasattr(cfg, k):
            try:
                setattr(cfg, k, v)
            except AttributeError:  # a derived property (Falcon's head_dim)
                pass
    _no_dropout(cfg)
    impl = "eager" if arch in EAGER_ONLY else "sdpa"
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation=impl).eval()
    ids = torch.randint(0, 128, (1, seq), generator=torch.Generator().manual_seed(seed + 1))
    return model, ids


def logits_of(model: nn.Module):
    """``(ids, mask=None) -> logits`` of ``model`` (no cache): the function a user hands to ``optimize``."""

    def logits(ids: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        return model(input_ids=ids, attention_mask=mask, use_cache=False).logits

    return logits


def left_padded(ids: torch.Tensor, pad: int = 5) -> tuple[torch.Tensor, torch.Tensor]:
    """A batch of two: ``ids`` and its reverse with its first ``pad`` tokens padding (attention mask 0), as a
    batched generation left-pads its shorter prompts; the padded rows' queries see no key at all."""
    batch = torch.cat([ids, ids.flip(-1)], 0)
    mask = torch.ones_like(batch)
    mask[1, :pad] = 0
    return batch, mask


# --- encoders (the other models users bring: BERT-style text encoders, ViT, T5's encoder) ----------------------

ENCODER_ARCHS = ("bert", "roberta", "distilbert", "modernbert", "deberta-v2", "t5", "vit")
"""``model_type`` names ``encoder`` builds: padded text batches (a key-padding mask) and images."""


def encoder(arch: str, seed: int = 0) -> tuple[nn.Module, tuple, torch.Tensor]:
    """A one-layer encoder of ``arch`` at hidden 64, 4 heads, no dropout; its inputs (token ids and a padding mask
    whose second row has 6 padding tokens, or two 32 x 32 images); and the weights of its real positions."""
    from transformers import AutoConfig, AutoModel, T5EncoderModel

    size: dict = {"hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4, "num_hidden_layers": 1,
                  "vocab_size": 128, "max_position_embeddings": 64, "pad_token_id": 0}
    if arch == "vit":
        size = {k: size[k] for k in ("hidden_size", "intermediate_size", "num_attention_heads", "num_hidden_layers")}
        size.update(image_size=32, patch_size=8)
    elif arch == "t5":
        size = {"d_model": 64, "d_ff": 128, "num_heads": 4, "num_layers": 1, "vocab_size": 128, "d_kv": 16}
    elif arch == "distilbert":
        size = {"dim": 64, "hidden_dim": 128, "n_heads": 4, "n_layers": 1, "vocab_size": 128,
                "max_position_embeddings": 64, "pad_token_id": 0}
    cfg = AutoConfig.for_model(arch, **size)
    _no_dropout(cfg)
    torch.manual_seed(seed)
    impl = "eager" if arch.startswith("deberta") else "sdpa"
    model = T5EncoderModel(cfg) if arch == "t5" else AutoModel.from_config(cfg, attn_implementation=impl)
    g = torch.Generator().manual_seed(seed + 1)
    if arch == "vit":
        return model.eval(), (torch.randn(2, 3, 32, 32, generator=g),), torch.ones(2, 1, 1)
    ids = torch.randint(1, 128, (2, 16), generator=g)
    mask = torch.ones_like(ids)
    mask[1, 10:] = 0
    return model.eval(), (ids, mask), mask[..., None].float()


def hidden_of(model: nn.Module, arch: str):
    """``inputs -> last hidden state`` of an ``encoder``."""
    if arch == "vit":
        return lambda x: model(pixel_values=x).last_hidden_state
    return lambda ids, mask: model(input_ids=ids, attention_mask=mask).last_hidden_state
