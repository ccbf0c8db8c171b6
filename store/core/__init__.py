"""The living image: one ZODB database opened by URI (``image``), its file and ZEO back ends,
its top-level layout (``layout``), transactions and their retries, schema upgrades, packing,
statistics, the scheduler's job store, the method queue, and the model weight files
(``model_files``)."""
