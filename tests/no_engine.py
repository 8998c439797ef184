"""A test hook (REPLAYLIB_TEST_ENGINE_FACTORY=no_engine:refuse): any engine a stage or preview would start
stops the run instead, so that a test can show nothing was computed on one."""


def refuse(params, invariant=False, forcing=False):
    raise RuntimeError(f"config {params.config}: an engine was started (the test allows none)")
