#!/usr/bin/python3
"""Tokens and key sets the way a Kubernetes API server makes them, for the
tests of rpc_jwt.c, by other hands than the code under test: the openssl
command signs (RS256: RSASSA-PKCS1-v1_5 over SHA-256) and Python's standard
library does the JSON and base64url.

  jwt_mint.py jwks KEY.pem [KID] > jwks.json
      the public key of KEY.pem as a JWKS (kty RSA, n, e)
  jwt_mint.py token KEY.pem HEADER.json CLAIMS.json
      a compact JWT: the header and claims as given (@NOW+N / @NOW-N in a
      claim's value become the Unix time now plus or minus N), signed with
      KEY.pem (header alg RS256), with the file's bytes as an HMAC key (alg
      HS256), or unsigned (alg none)
"""
import base64
import hashlib
import hmac
import json
import re
import subprocess
import sys
import time


def b64url(b):
    return base64.urlsafe_b64encode(b).rstrip(b"=").decode()


def jwks(key, kid):
    mod = subprocess.run(["openssl", "rsa", "-in", key, "-noout", "-modulus"],
                         check=True, capture_output=True, text=True).stdout
    n = int(re.search(r"Modulus=([0-9A-F]+)", mod).group(1), 16)
    text = subprocess.run(["openssl", "rsa", "-in", key, "-noout", "-text"],
                          check=True, capture_output=True, text=True).stdout
    e = int(re.search(r"publicExponent: (\d+)", text).group(1))
    k = {"use": "sig", "kty": "RSA", "alg": "RS256",
         "n": b64url(n.to_bytes((n.bit_length() + 7) // 8, "big")),
         "e": b64url(e.to_bytes((e.bit_length() + 7) // 8, "big"))}
    if kid:
        k["kid"] = kid
    return {"keys": [k]}


def now_claims(obj):
    t = int(time.time())
    if isinstance(obj, dict):
        return {k: now_claims(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [now_claims(v) for v in obj]
    if isinstance(obj, str) and obj.startswith("@NOW"):
        return t + int(obj[4:] or 0)
    return obj


def token(key, header, claims):
    signing = (b64url(json.dumps(header).encode()) + "." +
               b64url(json.dumps(now_claims(claims)).encode())).encode()
    alg = header.get("alg")
    if alg == "RS256":
        sig = subprocess.run(["openssl", "dgst", "-sha256", "-sign", key], input=signing,
                             check=True, capture_output=True).stdout
    elif alg == "HS256":
        with open(key, "rb") as f:
            sig = hmac.new(f.read(), signing, hashlib.sha256).digest()
    else:
        sig = b""
    return signing.decode() + "." + b64url(sig)


if __name__ == "__main__":
    if sys.argv[1] == "jwks":
        print(json.dumps(jwks(sys.argv[2], sys.argv[3] if len(sys.argv) > 3 else None)))
    else:
        with open(sys.argv[3]) as h, open(sys.argv[4]) as c:
            print(token(sys.argv[2], json.load(h), json.load(c)))
