"""TensorFlow (tensorflow-cpu) client: tf.train.Checkpoint saves a tf.Module
with variables of several dtypes plus a small Keras model and its Adam
state; restore() into freshly built objects must give the same values.
All TF work is in this one process (importing TensorFlow is slow).
See common.py for the protocol."""
from __future__ import annotations

import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import Client, check  # noqa: E402

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
import keras  # noqa: E402


class Vars(tf.Module):
    def __init__(self, seed):
        super().__init__()
        g = tf.random.Generator.from_seed(seed)
        self.w_f32 = tf.Variable(g.normal((256, 128)), name="w_f32")
        self.w_bf16 = tf.Variable(tf.cast(g.normal((128, 64)), tf.bfloat16), name="w_bf16")
        self.w_f16 = tf.Variable(tf.cast(g.normal((64, 33)), tf.float16), name="w_f16")
        self.w_f64 = tf.Variable(tf.cast(g.normal((10,)), tf.float64), name="w_f64")
        self.ids = tf.Variable(tf.range(seed, seed + 1000, dtype=tf.int64), name="ids")
        self.step = tf.Variable(seed, dtype=tf.int32, name="step")
        self.label = tf.Variable(f"run-{seed}", name="label")
        special = np.array([np.nan, np.inf, -np.inf, -0.0, 1e-45, 3.4e38, 1.0, 0.0], dtype=np.float32)
        special.view(np.uint32)[-1] = 0x7FC00001  # a second NaN payload
        self.special = tf.Variable(special if seed == 0 else np.zeros(8, np.float32), name="special")


def keras_model(seed):
    keras.utils.set_random_seed(seed)
    model = keras.Sequential([keras.Input((32,)), keras.layers.Dense(64, activation="relu"),
                              keras.layers.LayerNormalization(), keras.layers.Dense(8)])
    opt = keras.optimizers.Adam(1e-3)
    return model, opt


def train(model, opt, steps):
    x = tf.random.stateless_normal((16, 32), seed=(1, 2))
    for _ in range(steps):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(model(x)))
        opt.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))


def objects(seed, steps):
    v = Vars(seed)
    model, opt = keras_model(seed)
    train(model, opt, steps)
    return tf.train.Checkpoint(vars=v, model=model, optimizer=opt), v, model, opt


def values(v, model, opt):
    out = {name: np.asarray(var.numpy()) for name, var in sorted(vars(v).items()) if isinstance(var, tf.Variable)}
    # by position: Keras numbers layer names per process (dense, dense_2, ...)
    for i, w in enumerate(model.weights):
        out[f"model/{i}"] = np.asarray(w.numpy())
    for i, w in enumerate(opt.variables):
        out[f"optimizer/{i}"] = np.asarray(w.numpy())
    return out


def compare(c, expect, got, when):
    check(list(expect) == list(got), f"{when}: variables {list(got)[:8]} vs {list(expect)[:8]}")
    for k, a in expect.items():
        c.compare(a, got[k], f"{when}:{k}")


def main():
    c = Client()
    ckpt, v, model, opt = objects(seed=0, steps=3)
    expect = values(v, model, opt)
    check(len(expect) > 12, f"only {len(expect)} variables")
    saved = ckpt.save(str(c.mnt / "tf" / "ckpt"))  # .../ckpt-1 (and the `checkpoint` state file)
    prefix = os.path.basename(saved)
    # the same bundle without bumping the save counter or writing `checkpoint`
    ckpt.write(str(c.ref / "tf" / prefix))
    names = sorted(os.listdir(c.mnt / "tf"))
    check(names == sorted(["checkpoint", *os.listdir(c.ref / "tf")]), f"tf wrote {names}")
    for n in names:
        # only save() writes the `checkpoint` state file
        c.record(f"tf/{n}", ref=n != "checkpoint")

    def restore(when):
        ck2, v2, m2, o2 = objects(seed=1, steps=1)  # same structure, other values
        check(not np.array_equal(v2.w_f32.numpy(), expect["w_f32"]), "fresh variables equal the saved ones")
        latest = tf.train.latest_checkpoint(str(c.mnt / "tf"))
        check(latest == saved, f"{when}: latest_checkpoint {latest!r} vs {saved!r}")
        ck2.restore(latest).assert_consumed()
        compare(c, expect, values(v2, m2, o2), f"{when}:restore")
        # the index and data files are read through the mount by TF's own
        # reader too (it verifies each tensor's CRC32C)
        reader = tf.train.load_checkpoint(str(c.mnt / "tf" / prefix))
        shapes = reader.get_variable_to_shape_map()
        for key in shapes:
            if key.startswith("vars/w_f32/"):
                c.compare(expect["w_f32"], reader.get_tensor(key), f"{when}:reader[{key}]")
        del reader, ck2

    c.run(restore)


if __name__ == "__main__":
    main()
