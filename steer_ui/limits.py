"""Size limits on a steering vector and on the files that carry one.

Every vector file a visitor uploads is treated as hostile, so each reader
checks the sizes a file *declares* (shapes, offsets, counts, lengths) against
these numbers before it reads or decodes the data they describe, and
:class:`steer_ui.vector.SteeringVector` checks them again on every record.
They are generous for real vectors (a 65536-wide model, an L2S MLP of a
4096-wide model fits with room to spare) and small enough that one upload
cannot take a shared server's memory.

This module holds numbers only (no imports from the package), so anything may
import it.
"""
from __future__ import annotations

# ---------------------------------------------------------------- one vector
MAX_LAYERS = 1024  # directions per vector, and the largest layer index + 1
MAX_HIDDEN = 65536  # values per direction (the model's hidden size)
MAX_EXTRAS = 64  # extra tensors (TSV prototypes, the L2S MLP, ITI per-head data)
MAX_DIMS = 4  # dimensions of any tensor
MAX_ELEMENTS = 32 * 2**20  # elements in any one tensor (128 MB of float32)
MAX_VECTOR_BYTES = 256 * 2**20  # all tensors of one vector together, in their stored dtypes
MAX_EXTRA_KEY = 100  # characters in an extra tensor's name

# ---------------------------------------------------------------- metadata
MAX_NAME = 200  # characters in a vector's name
MAX_TEXT = 1000  # characters in any other text field (model id, type, revision, dates, hashes)
MAX_IDENTIFIER = 64  # characters in a method or site identifier
MAX_JSON_BYTES = 64 * 1024  # hyperparameters, and metrics, each as JSON
# a generation's Δlogit limit, and the one a vector carries: above it is no limit (logits of 262k-token
# vocabularies span a few hundred at most)
MAX_DELTA_LOGIT_LIMIT = 1000.0

# ---------------------------------------------------------------- files
MAX_FILE_BYTES = 512 * 2**20  # any vector file (or CAA directory) as uploaded
MAX_HEADER_BYTES = 4 * 2**20  # a safetensors JSON header
MAX_PICKLE_BYTES = 4 * 2**20  # the pickle part of a .pt file (the tensors' bytes are stored apart from it)
MAX_JSON_TOKENS = 2**20  # ',' ':' '[' '{' in a JSON file: bounds the Python objects parsing makes
MAX_GGUF_KV = 256  # key/value pairs in a GGUF control vector
MAX_GGUF_ARRAY = 4096  # elements of a GGUF array value (control vectors have none)
MAX_FILE_NAME = 100  # characters in a file or folder name made from a vector's name
