package credhelper

import (
	"encoding/json"
	"time"
)

// ProcessOutput is the JSON an AWS SDK expects from a credential_process
// (https://docs.aws.amazon.com/sdkref/latest/guide/feature-process-credentials.html).
// Expiration is always set, so the SDK runs the process again before the
// credential expires.
type ProcessOutput struct {
	Version         int    `json:"Version"`
	AccessKeyID     string `json:"AccessKeyId"`
	SecretAccessKey string `json:"SecretAccessKey"`
	SessionToken    string `json:"SessionToken"`
	Expiration      string `json:"Expiration"`
}

// ProcessJSON renders c for credential_process.
func ProcessJSON(c Credential) ([]byte, error) {
	return json.Marshal(ProcessOutput{
		Version:         1,
		AccessKeyID:     c.AccessKeyID,
		SecretAccessKey: c.SecretAccessKey,
		SessionToken:    c.SessionToken,
		Expiration:      c.Expiration.UTC().Format(time.RFC3339),
	})
}

// ContainerOutput is the container credentials endpoint's answer, as ECS
// serves it and the SDKs' container providers read it.
type ContainerOutput struct {
	AccessKeyID     string `json:"AccessKeyId"`
	SecretAccessKey string `json:"SecretAccessKey"`
	Token           string `json:"Token"`
	Expiration      string `json:"Expiration"`
}

// ContainerError is the endpoint's error body; the SDKs read code and
// message from it.
type ContainerError struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}

func containerJSON(c Credential) ([]byte, error) {
	return json.Marshal(ContainerOutput{
		AccessKeyID:     c.AccessKeyID,
		SecretAccessKey: c.SecretAccessKey,
		Token:           c.SessionToken,
		Expiration:      c.Expiration.UTC().Format(time.RFC3339),
	})
}
