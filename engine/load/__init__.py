"""Loading a model: the source grammar (loading), GGUF and Hugging Face files, the Hub, the bundled default model,
and the tokenizer. Each loader returns an `engine.model.model.Model` built from a `specs.ModelConfig`.
May import: specs, engine.errors, engine.model.model. Never serving, the server or streamlit.
"""
