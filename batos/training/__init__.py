"""Persona LoRA adapters: training on the base model (``lora``) and llama.cpp's GGUF
conversion and fusing (``gguf``).

May import ``batos.models``, ``prototypes``, ``store`` and the shared ``batos`` modules; the
graphs and the shell call it, never the reverse.
"""
