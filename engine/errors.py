"""The one exception type the engine raises for anything a user can fix (bad file, bad prompt, bad option)."""
from specs.model_config import SpecError


class ModelError(SpecError):
    """A model could not be loaded or run as asked. The message says what is wrong and what to do."""
