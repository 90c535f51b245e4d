"""Model families' forwards written out, gpt-fast style, over a Hugging Face model's own weights:
one file per family, read top to bottom, run by ``runners.lean.LeanRunner``.

    layer_spec.py  one description of a decoder layer read from the config: a family is a row
    llama.py   the Llama family (Llama, SmolLM2, Qwen2/Qwen2.5, Mistral) and its kin (Qwen3, OLMo 2,
               SmolLM3, Granite, Phi-3, Gemma 3), sliding windows included, as the description states:
               RMSNorm, RoPE, grouped-query attention over a static KV cache written by position
    llama_step.py  the same forward as one step of fixed shapes for torch.compile (``runners.step.StepRunner``):
               cache written with ``index_copy_`` at a slots tensor, attention over the whole capacity under a mask
"""
