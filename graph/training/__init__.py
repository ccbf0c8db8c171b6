"""Persona LoRA adapters: training on the base model (``lora``) and llama.cpp's GGUF
conversion and fusing (``gguf``)."""
