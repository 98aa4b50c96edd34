#!/usr/bin/env python3
"""Drive the STS emulator with botocore, a client nobody on this project wrote.

Usage: botocore_client.py ENDPOINT_URL ACCESS_KEY SECRET_KEY

Prints one JSON object describing what botocore saw; the Go test
(botocore_test.go) checks it. Secrets are never printed, only their lengths.
"""
import json
import sys

import botocore.session
from botocore.config import Config
from botocore.exceptions import ClientError


def client(endpoint, key, secret, token=None):
    session = botocore.session.get_session()
    return session.create_client(
        "sts",
        region_name="eu-central-1",  # any region: the emulator accepts every scope
        endpoint_url=endpoint,
        aws_access_key_id=key,
        aws_secret_access_key=secret,
        aws_session_token=token,
        # One attempt per call, so the emulator's counts match the script's.
        config=Config(retries={"total_max_attempts": 1}),
    )


def error_of(call):
    try:
        call()
    except ClientError as e:
        return {
            "code": e.response["Error"]["Code"],
            "status": e.response["ResponseMetadata"]["HTTPStatusCode"],
            "message": e.response["Error"]["Message"],
        }
    return None


def main():
    endpoint, key, secret = sys.argv[1:4]
    root = client(endpoint, key, secret)
    out = {}

    ar = root.assume_role(
        RoleArn="arn:aws:iam::123456789012:role/botocore/app",
        RoleSessionName="boto",
        DurationSeconds=900,
        Policy='{"Version":"2012-10-17","Statement":[]}',
        Tags=[{"Key": "team", "Value": "core"}],
    )
    creds = ar["Credentials"]
    out["assume_role"] = {
        "access_key_id": creds["AccessKeyId"],
        "secret_len": len(creds["SecretAccessKey"]),
        "token_len": len(creds["SessionToken"]),
        "expiration": creds["Expiration"].isoformat(),
        "arn": ar["AssumedRoleUser"]["Arn"],
        "assumed_role_id": ar["AssumedRoleUser"]["AssumedRoleId"],
        "packed_policy_size": ar.get("PackedPolicySize"),
        "request_id": ar["ResponseMetadata"]["RequestId"],
    }

    issued = client(endpoint, creds["AccessKeyId"], creds["SecretAccessKey"], creds["SessionToken"])
    out["caller_as_role"] = issued.get_caller_identity()["Arn"]

    st = root.get_session_token(DurationSeconds=900)["Credentials"]
    out["session_token_key_prefix"] = st["AccessKeyId"][:4]

    ft = root.get_federation_token(Name="boto-fed")
    out["federated_arn"] = ft["FederatedUser"]["Arn"]

    out["wrong_secret"] = error_of(lambda: client(endpoint, key, secret + "x").get_caller_identity())
    out["invalid_session_name"] = error_of(
        lambda: root.assume_role(RoleArn="arn:aws:iam::123456789012:role/app", RoleSessionName="has space")
    )
    json.dump(out, sys.stdout)


if __name__ == "__main__":
    main()
