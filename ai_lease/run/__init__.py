"""Running jobs: single-flight runs, one attempt, the pipeline framework and its default
stages, progress, the stream guard and the worker loop."""
