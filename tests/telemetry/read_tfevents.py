#!/usr/bin/env python3
"""Independent reader of TensorBoard event files, for gradguard's tests.

Written from the format's description, sharing no code with gradguard's C++ writer, so a
mistake in the writer (framing, CRC, field numbers, wire types) shows up as a failure here
rather than being mirrored. Standard library only (no tensorflow, tensorboard or protobuf).

  read_tfevents.py FILE       prints {"file_version": ..., "scalars": [{tag, step, value,
                              wall_time}, ...]} as JSON; exits 1 on any corruption
                              (bad length or data CRC, truncated record, malformed
                              protobuf), with the reason on stderr
  read_tfevents.py --self-test  checks the CRC-32C and the protobuf decoder on known vectors

File format: records of  uint64 length | uint32 masked_crc32c(length bytes) | data |
uint32 masked_crc32c(data), all little-endian, where
masked(crc) = ((crc >> 15) | (crc << 17)) + 0xa282ead8 (mod 2^32). Each data block is a
tensorflow.Event: wall_time = 1 (double), step = 2 (int64), file_version = 3 (string),
summary = 5 (Summary { repeated Value value = 1 }, Value { tag = 1, simple_value = 2 (float) }).
"""

import json
import math
import struct
import sys

CASTAGNOLI_REFLECTED = 0x82F63B78


class Corrupt(Exception):
    pass


def crc32c(data):
    """CRC-32C, bit at a time (deliberately not table-driven like the C++ one)."""
    crc = 0xFFFFFFFF
    for byte in data:
        crc ^= byte
        for _ in range(8):
            crc = (crc >> 1) ^ CASTAGNOLI_REFLECTED if crc & 1 else crc >> 1
    return crc ^ 0xFFFFFFFF


def masked_crc32c(data):
    crc = crc32c(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def read_varint(buf, pos):
    result = 0
    shift = 0
    while True:
        if pos >= len(buf):
            raise Corrupt("truncated varint")
        byte = buf[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, pos
        shift += 7
        if shift >= 70:
            raise Corrupt("varint longer than 10 bytes")


def decode_message(buf):
    """Generic protobuf decoding: {field_number: [(wire_type, value), ...]}."""
    fields = {}
    pos = 0
    while pos < len(buf):
        key, pos = read_varint(buf, pos)
        field, wire = key >> 3, key & 7
        if field == 0:
            raise Corrupt("field number 0")
        if wire == 0:
            value, pos = read_varint(buf, pos)
        elif wire == 1:
            if pos + 8 > len(buf):
                raise Corrupt("truncated 64-bit field %d" % field)
            value = buf[pos:pos + 8]
            pos += 8
        elif wire == 2:
            length, pos = read_varint(buf, pos)
            if pos + length > len(buf):
                raise Corrupt("length-delimited field %d runs past its message" % field)
            value = buf[pos:pos + length]
            pos += length
        elif wire == 5:
            if pos + 4 > len(buf):
                raise Corrupt("truncated 32-bit field %d" % field)
            value = buf[pos:pos + 4]
            pos += 4
        else:
            raise Corrupt("unsupported wire type %d (field %d)" % (wire, field))
        fields.setdefault(field, []).append((wire, value))
    return fields


def single(fields, number, wire):
    """The last occurrence of a scalar field (protobuf's rule), checking its wire type."""
    if number not in fields:
        return None
    got_wire, value = fields[number][-1]
    if got_wire != wire:
        raise Corrupt("field %d has wire type %d, expected %d" % (number, got_wire, wire))
    return value


def to_int64(value):
    return value - (1 << 64) if value >= (1 << 63) else value


def read_records(data):
    pos = 0
    index = 0
    while pos < len(data):
        if pos + 12 > len(data):
            raise Corrupt("record %d: truncated header" % index)
        header = data[pos:pos + 8]
        (length,) = struct.unpack("<Q", header)
        (length_crc,) = struct.unpack("<I", data[pos + 8:pos + 12])
        if masked_crc32c(header) != length_crc:
            raise Corrupt("record %d: length CRC mismatch" % index)
        start = pos + 12
        if start + length + 4 > len(data):
            raise Corrupt("record %d: truncated data" % index)
        payload = data[start:start + length]
        (data_crc,) = struct.unpack("<I", data[start + length:start + length + 4])
        if masked_crc32c(payload) != data_crc:
            raise Corrupt("record %d: data CRC mismatch" % index)
        yield index, payload
        pos = start + length + 4
        index += 1


def finite_or_text(x):
    return x if math.isfinite(x) else repr(x)


def read_file(path):
    with open(path, "rb") as f:
        data = f.read()
    result = {"file_version": None, "scalars": []}
    for index, payload in read_records(data):
        event = decode_message(payload)
        raw_wall = single(event, 1, 1)
        wall_time = struct.unpack("<d", raw_wall)[0] if raw_wall is not None else 0.0
        step = to_int64(single(event, 2, 0) or 0)
        version = single(event, 3, 2)
        if version is not None:
            if index != 0:
                raise Corrupt("record %d: file_version outside the first record" % index)
            result["file_version"] = version.decode("utf-8")
        summary = single(event, 5, 2)
        if summary is None:
            continue
        for wire, raw_value in decode_message(summary).get(1, []):
            if wire != 2:
                raise Corrupt("record %d: Summary.value with wire type %d" % (index, wire))
            value = decode_message(raw_value)
            tag = single(value, 1, 2)
            simple = single(value, 2, 5)
            if tag is None or simple is None:
                raise Corrupt("record %d: Summary.Value without tag or simple_value" % index)
            result["scalars"].append({
                "tag": tag.decode("utf-8"),
                "step": step,
                "value": finite_or_text(struct.unpack("<f", simple)[0]),
                "wall_time": wall_time,
            })
    if result["file_version"] is None:
        raise Corrupt("no file_version record")
    return result


def self_test():
    assert crc32c(b"123456789") == 0xE3069283, hex(crc32c(b"123456789"))
    assert crc32c(b"") == 0
    # RFC 3720 (iSCSI) B.4: 32 bytes of zeros.
    assert crc32c(bytes(32)) == 0x8A9136AA, hex(crc32c(bytes(32)))
    assert read_varint(b"\xac\x02", 0) == (300, 2)
    assert to_int64(read_varint(b"\xff" * 9 + b"\x01", 0)[0]) == -1
    msg = decode_message(b"\x08\x96\x01\x12\x03abc\x1d\x00\x00\x80\x3f")
    assert msg[1] == [(0, 150)] and msg[2] == [(2, b"abc")]
    assert struct.unpack("<f", msg[3][0][1])[0] == 1.0
    try:
        decode_message(b"\x12\x05ab")
    except Corrupt:
        pass
    else:
        raise AssertionError("a truncated field must be rejected")
    print("self-test ok")


def main(argv):
    if len(argv) == 2 and argv[1] == "--self-test":
        self_test()
        return 0
    if len(argv) != 2:
        print("usage: read_tfevents.py FILE | --self-test", file=sys.stderr)
        return 2
    try:
        result = read_file(argv[1])
    except (Corrupt, UnicodeDecodeError) as e:
        print("%s: corrupt: %s" % (argv[1], e), file=sys.stderr)
        return 1
    except OSError as e:
        print("%s: %s" % (argv[1], e), file=sys.stderr)
        return 1
    json.dump(result, sys.stdout, allow_nan=False)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
