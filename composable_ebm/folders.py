"""What a model folder holds, by name: the one place the file names are written (`composable_ebm.persistence`
writes and reads them, `composable_ebm.hub` moves them)."""

CONFIG_NAME = "config.json"
WEIGHTS_NAME = "model.safetensors"
CARD_NAME = "README.md"
MODEL_FILES = (CONFIG_NAME, WEIGHTS_NAME, CARD_NAME)
