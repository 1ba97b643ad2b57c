"""Transfer: vectors written to and read from files (native, GGUF control vector, steering-vectors, Neuronpedia,
CAA), each read validated against the loaded model like any other vector."""
from __future__ import annotations

from dataclasses import dataclass
import tempfile
from pathlib import Path

from ..messages import UserError, said_of
from ..paths import prune
from .common import Shared, expected_errors, refusal
from .library import Library
from .models import Models

FORMATS = ("native", "gguf", "steering-vectors", "neuronpedia", "caa")


@dataclass
class Transfer:
    shared: Shared
    models: Models
    library: Library

    def export_vector(self, session: str | None, vector_name: str, fmt: str, layer: int | None = None,
                      seed: int = 0) -> list[Path]:
        """Write the vector in ``fmt`` into a fresh folder; returns the written files."""
        if fmt not in FORMATS:
            raise UserError("unknown_format", fmt=fmt, known=", ".join(FORMATS))
        vector = self.library.get_vector(session, vector_name, layer, seed)
        from ..formats import export_path, write_vector

        policy, workdir = self.shared.policy, self.shared.workdir
        prune(workdir, policy.export_max_bytes, policy.export_keep_seconds, pattern="export-*")
        out_dir = Path(tempfile.mkdtemp(prefix="export-", dir=workdir))
        out = export_path(out_dir, vector.name or vector.method, fmt)  # a name like '..' cannot leave out_dir

        try:
            written = write_vector(vector, fmt, out)
        except expected_errors() as exc:
            raise UserError("export_failed", fmt=fmt, detail=said_of(exc)) from None
        files: list[Path] = []
        for p in written or []:
            p = Path(p)
            files.extend(sorted(q for q in p.rglob("*") if q.is_file()) if p.is_dir() else [p])
        if not files:
            raise UserError("export_failed", fmt=fmt, detail="nothing was written")
        return files

    def import_vector(self, session: str | None, path: str | Path | None,
                      name: str | None = None) -> tuple[str, list[str]]:
        """Read a vector file in any supported format, validated against the loaded model."""
        from ..formats import read_vector
        from ..vector import file_detail

        if not path:
            raise UserError("no_file")
        path = Path(path)
        if not path.is_file():
            raise UserError("file_missing", name=path.name)
        limit = self.shared.max_file_bytes
        if path.stat().st_size > limit:
            raise UserError("file_too_large", name=path.name, size=path.stat().st_size >> 20, limit=limit >> 20)
        handle = self.models.handle
        try:
            vector, warnings = read_vector(path, handle, max_bytes=limit)  # validates against the model
        except expected_errors() + (OSError, KeyError, TypeError) as exc:
            raise refusal(exc, "import_failed", name=path.name, detail=file_detail(exc)) from None
        return self.library.add_vector(session, vector, name or vector.name or path.stem), list(warnings)
