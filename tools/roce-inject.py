#!/usr/bin/env python3
"""roce-inject: send forged RoCEv2 packets from a raw Ethernet socket (root only).

    roce-inject.py write --iface IF --dst-mac MAC --src-ip A --dst-ip B --qpn N --psn P
                   [--count K] --va ADDR --rkey R --payload HEX
    roce-inject.py send-ud --iface IF --dst-mac MAC --src-ip A --dst-ip B --qpn N
                   --qkey Q --src-qpn S --payload HEX [--count K]

`write` sends K RDMA WRITE Only packets (RC) with PSNs P, P+1, ... (mod 2^24); `send-ud`
sends K SEND Only datagrams (UD). Each is a complete frame: Ethernet, IPv4 (ID counting
from 1, DF), UDP to port 4791 (checksum 0, as RoCEv2 allows over IPv4), the Base Transport
Header, a RETH (virtual address, rkey, length) or a DETH (Q_Key, source QP), the payload
padded to 4 bytes, and an ICRC computed the way the InfiniBand specification's RoCEv2 annex
says and Linux's rxe checks it (drivers/infiniband/sw/rxe/rxe_icrc.c): CRC-32 over 8 bytes of
0xff standing for a masked LRH, the IPv4 header with TOS, TTL and checksum set to all ones,
the UDP header with its checksum set to all ones, the BTH with its reserved byte (resv8a)
set to all ones, the rest of the transport headers and the payload; stored little-endian.

bootstrap/tests/device_inject.rs runs it against a rank on rxe (docs/security.md); it sends
on IF, the far end of a veth pair whose near end carries the rxe device, so the frames
arrive the way a packet from another host on the wire would. Prints one line: how many
frames it sent.
"""
import argparse
import socket
import struct
import sys
import zlib

ROCE_PORT = 4791
RC_RDMA_WRITE_ONLY = 0x0A
UD_SEND_ONLY = 0x64


def ip_checksum(header):
    s = sum(struct.unpack("!%dH" % (len(header) // 2), header))
    while s >> 16:
        s = (s & 0xFFFF) + (s >> 16)
    return ~s & 0xFFFF


def frame(args, opcode, psn, ext, payload, ident):
    pad = (-len(payload)) % 4
    body = payload + b"\0" * pad
    # BTH: opcode; SE=0 M=0 PadCnt TVer=0; P_Key (default partition); resv8a; dest QP;
    # AckReq and reserved bits; PSN.
    bth = struct.pack("!BBHI", opcode, pad << 4, 0xFFFF, args.qpn & 0xFFFFFF)
    bth += struct.pack("!I", psn & 0xFFFFFF)
    transport = bth + ext + body
    udp_len = 8 + len(transport) + 4
    udp = struct.pack("!HHHH", args.src_port, ROCE_PORT, udp_len, 0)
    total = 20 + udp_len
    src, dst = socket.inet_aton(args.src_ip), socket.inet_aton(args.dst_ip)
    ip = struct.pack("!BBHHHBBH4s4s", 0x45, 0, total, ident & 0xFFFF, 0x4000, 64, 17, 0, src, dst)
    ip = ip[:10] + struct.pack("!H", ip_checksum(ip)) + ip[12:]
    # The ICRC's view: variant fields masked to ones.
    ip_m = ip[:1] + b"\xff" + ip[2:8] + b"\xff" + ip[9:10] + b"\xff\xff" + ip[12:]
    udp_m = udp[:6] + b"\xff\xff"
    bth_m = bth[:4] + b"\xff" + bth[5:]
    icrc = zlib.crc32(b"\xff" * 8 + ip_m + udp_m + bth_m + ext + body) & 0xFFFFFFFF
    eth = mac(args.dst_mac) + mac(args.src_mac) + struct.pack("!H", 0x0800)
    return eth + ip + udp + transport + struct.pack("<I", icrc)


def mac(text):
    b = bytes(int(x, 16) for x in text.split(":"))
    if len(b) != 6:
        raise ValueError("not a MAC address: " + text)
    return b


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("kind", choices=["write", "send-ud"])
    p.add_argument("--iface", required=True)
    p.add_argument("--dst-mac", required=True)
    p.add_argument("--src-mac", default="02:00:00:00:00:99")
    p.add_argument("--src-ip", required=True)
    p.add_argument("--dst-ip", required=True)
    p.add_argument("--src-port", type=int, default=0xC0DE)
    p.add_argument("--qpn", type=lambda s: int(s, 0), required=True)
    p.add_argument("--psn", type=lambda s: int(s, 0), default=0)
    p.add_argument("--count", type=int, default=1)
    p.add_argument("--va", type=lambda s: int(s, 0), default=0)
    p.add_argument("--rkey", type=lambda s: int(s, 0), default=0)
    p.add_argument("--qkey", type=lambda s: int(s, 0), default=0)
    p.add_argument("--src-qpn", type=lambda s: int(s, 0), default=1)
    p.add_argument("--payload", required=True, help="hex bytes")
    args = p.parse_args()
    payload = bytes.fromhex(args.payload)
    s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW)
    s.bind((args.iface, 0))
    sent = 0
    for i in range(args.count):
        if args.kind == "write":
            reth = struct.pack("!QII", args.va, args.rkey, len(payload))
            f = frame(args, RC_RDMA_WRITE_ONLY, args.psn + i, reth, payload, i + 1)
        else:
            deth = struct.pack("!II", args.qkey, args.src_qpn & 0xFFFFFF)
            f = frame(args, UD_SEND_ONLY, args.psn + i, deth, payload, i + 1)
        s.send(f)
        sent += 1
    print("roce-inject: sent %d %s frame(s) on %s" % (sent, args.kind, args.iface))
    return 0


if __name__ == "__main__":
    sys.exit(main())
