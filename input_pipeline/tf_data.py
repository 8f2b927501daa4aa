"""TensorFlow as this project uses it: tf.data and checkpoint reading, never Keras.

`import tensorflow` eagerly imports Keras 3 (2-3 s of CPU in every process that starts, ~a
quarter of TensorFlow's import) unless TF_USE_LEGACY_KERAS points tf.keras at the separate
tf_keras package, which is then imported only if something touches tf.keras. Nothing here
does; a process that wants tf.keras sets the variable itself before this import.
"""

import os

os.environ.setdefault('TF_USE_LEGACY_KERAS', '1')

import tensorflow as tf  # noqa: E402  pylint: disable=g-import-not-at-top,wrong-import-position

__all__ = ['tf']
