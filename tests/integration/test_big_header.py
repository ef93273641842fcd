"""A safetensors file with a ~44 MB header (440k tiny tensors) once drove the
daemon to 655 MB RSS while sealing: the header was parsed into a JSON DOM.
The header is now streamed and the parsed layout capped at 64 MiB
(codec/formats/limits.h); past it the file takes the generic codec. The
file must round-trip, and the daemon's peak RSS stay bounded."""
import struct

TENSORS = 440_000
# Cap on the layout (64 MiB) + the daemon's own footprint and seal buffers
# (a few 4 MiB chunks); far below the 655 MB the DOM took.
MAX_SEAL_HWM_MIB = 200


def big_header_safetensors() -> bytes:
    parts = ['{"__metadata__":{"format":"pt"}']
    for i in range(TENSORS):
        parts.append(f',"model.layers.{i}.mlp.experts.weight":{{"dtype":"F32","shape":[1],'
                     f'"data_offsets":[{4 * i},{4 * i + 4}]}}')
    parts.append("}")
    text = "".join(parts).encode()
    text += b" " * (-len(text) % 8)
    assert len(text) > 40 << 20
    data = bytes(range(256)) * (4 * TENSORS // 256) + bytes(4 * TENSORS % 256)
    return struct.pack("<Q", len(text)) + text + data


def test_big_safetensors_header_bounded_memory(mount_factory):
    m = mount_factory(name="bighdr")
    blob = big_header_safetensors()
    (m.mnt / "many.safetensors").write_bytes(blob)
    m.wait_sealed()
    hwm = m.vm_hwm_kib()
    assert hwm is not None
    print(f"daemon VmHWM after sealing a {len(blob) >> 20} MiB file with a 44 MB header: {hwm >> 10} MiB")
    assert hwm < MAX_SEAL_HWM_MIB << 10, f"daemon peak RSS {hwm >> 10} MiB while sealing a 44 MB header"
    m.remount()
    assert (m.mnt / "many.safetensors").read_bytes() == blob
