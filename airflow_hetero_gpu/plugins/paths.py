"""Where the cluster page is served (imported by the light plugin class and by the app alike)."""

URL_PREFIX = "/hetero-gpu"
PLUGIN_NAME = "hetero_gpu"
