# Regenerates the TensorFlow bundles used by tests/unit/tf_bundle_test.cc:
#   TF_CPP_MIN_LOG_LEVEL=3 python gen.py   (TensorFlow 2.x; written with 2.21)
# single/ckpt-1.*: one shard, one variable per dtype; sharded/sh-1.*: the
# same kind of save split by MaxShardSizePolicy, so large variables become
# slices spread over several .data shards.
import os
import shutil

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
import numpy as np
import tensorflow as tf

here = os.path.dirname(os.path.abspath(__file__))


def arange(n, dtype, shape):
    return tf.Variable(tf.constant(np.arange(n).astype(dtype).reshape(shape)))


def save(sub, prefix, variables, options=None):
    d = os.path.join(here, sub)
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(d)
    path = tf.train.Checkpoint(**variables).save(os.path.join(d, prefix), options=options)
    os.remove(os.path.join(d, "checkpoint"))
    for name, shape in tf.train.list_variables(path):
        print(sub, name, shape, tf.train.load_checkpoint(path).get_variable_to_dtype_map()[name].name)


save("single", "ckpt", {
    "f32": arange(12, np.float32, [4, 3]), "f64": arange(3, np.float64, [3]), "i64": arange(5, np.int64, [5]),
    "f16": arange(4, np.float16, [2, 2]), "bf16": tf.Variable(tf.ones([3], tf.bfloat16)),
    "u8": arange(7, np.uint8, [7]), "i8": arange(6, np.int8, [2, 3]), "i16": arange(2, np.int16, [2]),
    "i32": arange(8, np.int32, [2, 2, 2]), "c64": arange(2, np.complex64, [2]), "flag": tf.Variable(True),
    "text": tf.Variable("hello"), "scalar": tf.Variable(3.5),
})
policy = tf.train.experimental.MaxShardSizePolicy(max_shard_size=400)
save("sharded", "sh", {"w": arange(192, np.float32, [16, 12]), "b": arange(40, np.float64, [40]),
                       "h": arange(30, np.float16, [5, 6])},
     tf.train.CheckpointOptions(experimental_sharding_callback=policy))
