package credhelper

import (
	"crypto/rand"
	"crypto/subtle"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"strings"
)

// Handler answers the container credentials protocol: a GET carrying the
// Authorization token gets the cached credential as JSON.
type Handler struct {
	Cache *Cache
	// AuthToken is the value the Authorization header must carry.
	AuthToken string
}

func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Cache-Control", "no-store")
	if r.Method != http.MethodGet {
		w.Header().Set("Allow", http.MethodGet)
		writeError(w, http.StatusMethodNotAllowed, "MethodNotAllowed", "only GET is served")
		return
	}
	got := r.Header.Get("Authorization")
	if got == "" {
		writeError(w, http.StatusUnauthorized, "Unauthorized", "missing Authorization header: give the SDK the token with AWS_CONTAINER_AUTHORIZATION_TOKEN or AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE")
		return
	}
	if subtle.ConstantTimeCompare([]byte(got), []byte(h.AuthToken)) != 1 {
		writeError(w, http.StatusForbidden, "Forbidden", "the Authorization header does not match this helper's token")
		return
	}
	cred, err := h.Cache.Get()
	if err != nil {
		writeError(w, http.StatusServiceUnavailable, "CredentialsUnavailable", err.Error())
		return
	}
	body, err := containerJSON(cred)
	if err != nil {
		writeError(w, http.StatusInternalServerError, "InternalError", "encoding the credential failed")
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Write(body)
}

func writeError(w http.ResponseWriter, status int, code, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(ContainerError{Code: code, Message: msg})
}

// LoadOrCreateToken returns the authorization token in path, or when path
// does not exist creates it with a new random token, readable by the owner
// only. created says whether it was made here.
func LoadOrCreateToken(path string) (token string, created bool, err error) {
	b, err := os.ReadFile(path)
	if err == nil {
		token = string(b)
		if strings.TrimSpace(token) != token {
			return "", false, fmt.Errorf("the authorization token in %s starts or ends with white space (a newline, say), which SDKs send as is and botocore refuses; write it without one, or remove the file to have one generated", path)
		}
		if len(token) < 16 {
			return "", false, fmt.Errorf("the authorization token in %s is shorter than 16 characters; remove the file to have one generated", path)
		}
		return token, false, nil
	}
	if !errors.Is(err, os.ErrNotExist) {
		return "", false, fmt.Errorf("reading the authorization token: %w", err)
	}
	raw := make([]byte, 32)
	if _, err := rand.Read(raw); err != nil {
		return "", false, err
	}
	token = hex.EncodeToString(raw)
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return "", false, fmt.Errorf("creating the authorization token file: %w", err)
	}
	// No trailing newline: SDKs send the file's bytes as the header value
	// (botocore refuses a value with a newline).
	if _, err := f.WriteString(token); err != nil {
		f.Close()
		return "", false, err
	}
	return token, true, f.Close()
}

// CheckListen refuses an address other hosts could reach unless
// allowRemote: a credential endpoint belongs to the host's own processes.
func CheckListen(addr string, allowRemote bool) error {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("--listen %q: %v (use host:port, e.g. 127.0.0.1:9911)", addr, err)
	}
	if host == "localhost" {
		return nil
	}
	if ip := net.ParseIP(host); ip != nil && ip.IsLoopback() {
		return nil
	}
	if allowRemote {
		return nil
	}
	return fmt.Errorf("--listen %q is reachable from other hosts; serving credentials there needs --allow-remote (the authorization token is always required)", addr)
}
