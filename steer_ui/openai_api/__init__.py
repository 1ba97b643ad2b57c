"""An OpenAI-compatible front (``/v1``) over the door: :mod:`.server` routes, :mod:`.requests` reads request
bodies, :mod:`.answers` shapes responses."""
