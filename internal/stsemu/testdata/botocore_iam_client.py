#!/usr/bin/env python3
"""Drive the emulator's IAM API with botocore, a client nobody on this project wrote.

Usage: botocore_iam_client.py ENDPOINT_URL ACCESS_KEY SECRET_KEY

Rotates the user's key the way a careful client does (create, verify with
STS, delete the old one) and records what botocore saw, as one JSON object
for the Go test (iam_external_test.go). Secrets are never printed, only
their lengths.
"""
import json
import sys

import botocore.session
from botocore.config import Config
from botocore.exceptions import ClientError


def client(service, endpoint, key, secret, region="us-east-1"):
    session = botocore.session.get_session()
    return session.create_client(
        service,
        # IAM is signed for us-east-1 whatever region a caller works in.
        region_name=region,
        endpoint_url=endpoint,
        aws_access_key_id=key,
        aws_secret_access_key=secret,
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
    iam = client("iam", endpoint, key, secret)
    out = {}

    user = iam.get_user()["User"]
    out["user"] = {
        "name": user["UserName"],
        "arn": user["Arn"],
        "id": user["UserId"],
        "path": user["Path"],
        "created": user["CreateDate"].isoformat(),
    }
    listed = iam.list_access_keys()
    out["keys_before"] = [[k["AccessKeyId"], k["Status"]] for k in listed["AccessKeyMetadata"]]
    out["truncated"] = listed["IsTruncated"]

    created = iam.create_access_key()["AccessKey"]
    new_id, new_secret = created["AccessKeyId"], created["SecretAccessKey"]
    out["created"] = {
        "id": new_id,
        "secret_len": len(new_secret),
        "status": created["Status"],
        "user": created["UserName"],
        "created": created["CreateDate"].isoformat(),
    }
    out["quota"] = error_of(lambda: iam.create_access_key())

    new_sts = client("sts", endpoint, new_id, new_secret)
    out["caller_with_new_key"] = new_sts.get_caller_identity()["Arn"]
    new_iam = client("iam", endpoint, new_id, new_secret)
    new_iam.update_access_key(AccessKeyId=new_id, Status="Inactive")
    out["inactive_sts"] = error_of(lambda: new_sts.get_caller_identity())
    out["inactive_iam"] = error_of(lambda: new_iam.get_user())
    iam.update_access_key(AccessKeyId=new_id, Status="Active")

    # The new key retires the old one.
    new_iam.delete_access_key(AccessKeyId=key)
    out["old_key_sts"] = error_of(lambda: client("sts", endpoint, key, secret).get_caller_identity())
    out["delete_again"] = error_of(lambda: new_iam.delete_access_key(AccessKeyId=key))
    out["keys_after"] = [[k["AccessKeyId"], k["Status"]] for k in new_iam.list_access_keys()["AccessKeyMetadata"]]
    out["wrong_region"] = error_of(lambda: client("iam", endpoint, new_id, new_secret, "eu-central-1").get_user())
    json.dump(out, sys.stdout)


if __name__ == "__main__":
    main()
