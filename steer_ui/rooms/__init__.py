"""The rooms behind the door (:mod:`steer_ui.service`), one module for each thing the app keeps or does.

* :mod:`.models`: load and switch the shared model, its facts, the default view's calibration, the engine;
* :mod:`.library`: vectors (own, shared, listed, bundled, random), shares and saved results, over the store;
* :mod:`.datasets`: a session's dataset: bundled ones, uploads, summaries, the held-out pairs;
* :mod:`.explore`: Explore's next-token view, α calibration, sampling, generation, the α sweep;
* :mod:`.evaluation`: one vector over many prompts (margins, steerability);
* :mod:`.training`: methods and their settings, training, probes, jobs and Cancel;
* :mod:`.detection`: scoring answers with a detector vector;
* :mod:`.transfer`: importing and exporting vector files;
* :mod:`.lessons`: the Concepts tab's lessons, bounded and run as jobs.

A room takes plain values (a session id, a prompt, numbers) and returns plain values or data frames; it never
imports a front (the UI, the CLI) nor the door.  Rooms find a session through the finder the door hands them,
so a request is checked in the same order as before the split (validation first, a new session only after).
"""
