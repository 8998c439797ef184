"""GGUF -> bf16 HF directory as in shared/gpu/probe_real_model.py (no GgufConfig)."""
import sys, time, torch
from transformers import AutoModelForCausalLM, AutoTokenizer
out = sys.argv[1]; t0 = time.time()
tok = AutoTokenizer.from_pretrained("/tmp/gg", gguf_file="model.gguf")
m = AutoModelForCausalLM.from_pretrained("/tmp/gg", gguf_file="model.gguf", dtype=torch.bfloat16)
m.hf_quantizer = None
if hasattr(m.config, "quantization_config"): del m.config.quantization_config
m.is_quantized = False
m.save_pretrained(out, safe_serialization=True); tok.save_pretrained(out)
print("converted (fallback) in", round(time.time() - t0, 1), "s")
