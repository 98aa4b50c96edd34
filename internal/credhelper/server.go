package credhelper

import (
	"crypto/rand"
	"crypto/subtle"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"
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
		status, code := statusOf(err)
		writeError(w, status, code, err.Error())
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

// statusOf is the endpoint's status and error code for a failure to get a
// credential. Only a failure that asking again can cure gets a status the
// SDKs retry: aws-sdk-go-v2's container provider retries 429, 500, 502, 503
// and 504 (and throttling codes), up to 3 attempts, and fails at once on any
// other 4xx with the body's code and message. A refused Vault token, a
// policy without read, an unknown role stay so until someone changes them,
// so they get a 4xx. botocore retries every non-200 answer 3 times, 1 s
// apart, whatever its status; the helper answers those retries from memory
// (Cache.Get), so they cost Vault nothing.
func statusOf(err error) (int, string) {
	var e *Error
	if errors.As(err, &e) {
		if a, ok := kindAnswers[e.Kind]; ok {
			return a.status, a.code
		}
	}
	return http.StatusServiceUnavailable, "CredentialsUnavailable"
}

// kindAnswers are the kinds of failure answered otherwise than 503
// CredentialsUnavailable.
var kindAnswers = map[Kind]struct {
	status int
	code   string
}{
	KindNoToken:    {http.StatusForbidden, "VaultTokenMissing"},
	KindForbidden:  {http.StatusForbidden, "VaultPermissionDenied"},
	KindNotFound:   {http.StatusNotFound, "VaultPathNotFound"},
	KindBadRequest: {http.StatusBadRequest, "VaultRefused"},
	KindMalformed:  {http.StatusBadGateway, "VaultAnswerMalformed"},
	KindSealed:     {http.StatusServiceUnavailable, "VaultSealed"},
	KindTokenFile:  {http.StatusServiceUnavailable, "VaultTokenFileUnreadable"},
}

// The endpoint's connection limits.
const (
	// ReadHeaderTimeout bounds a request's headers: the SDKs send a few
	// hundred bytes at once.
	ReadHeaderTimeout = 10 * time.Second
	// IdleTimeout closes a kept-alive connection that has carried no
	// request for this long. An SDK asks again only when its credential
	// nears expiry (minutes at the least), so keeping the connection saves
	// nothing, and without a limit every client that ever connected keeps
	// a connection (and a goroutine) open for good.
	IdleTimeout = 30 * time.Second
)

// NewServer is the endpoint's HTTP server for h, with its connection limits.
func NewServer(h http.Handler) *http.Server {
	return &http.Server{Handler: h, ReadHeaderTimeout: ReadHeaderTimeout, IdleTimeout: IdleTimeout}
}

func writeError(w http.ResponseWriter, status int, code, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(ContainerError{Code: code, Message: msg})
}

// LoadOrCreateToken returns the authorization token in path, or when path
// does not exist creates it with a new random token, readable by the owner
// only. created says whether it was made here.
//
// Whoever can write the file chooses the token that unlocks the credential,
// so, as ssh does with a private key, an existing file is used only when it
// is a regular file owned by the user running the helper and closed to group
// and others; a symbolic link is never followed, neither to read nor to
// create.
func LoadOrCreateToken(path string) (token string, created bool, err error) {
	return loadOrCreateToken(path, os.Geteuid())
}

// loadOrCreateToken is LoadOrCreateToken for the user euid.
func loadOrCreateToken(path string, euid int) (token string, created bool, err error) {
	// O_NONBLOCK: a FIFO put there must not hang the start; the checks on
	// the open file then refuse it.
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_NONBLOCK, 0)
	switch {
	case err == nil:
		defer f.Close()
		return readToken(f, path, euid)
	case errors.Is(err, syscall.ELOOP):
		return "", false, fmt.Errorf("the authorization token file %s is a symbolic link, which is never followed (whoever can change the link chooses the token): give the path of the file itself", path)
	case !errors.Is(err, os.ErrNotExist):
		return "", false, fmt.Errorf("reading the authorization token file: %w", err)
	}
	token, err = createToken(path)
	return token, err == nil, err
}

// createToken writes a new random token to path, which must not exist: not
// even as a symbolic link, which a link put there between the look and the
// create would otherwise have it write through.
func createToken(path string) (string, error) {
	raw := make([]byte, 32)
	if _, err := rand.Read(raw); err != nil {
		return "", err
	}
	token := hex.EncodeToString(raw)
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL|syscall.O_NOFOLLOW, 0o600)
	if err != nil {
		return "", createError(path, err)
	}
	// No trailing newline: SDKs send the file's bytes as the header value
	// (botocore refuses a value with a newline).
	if _, err := f.WriteString(token); err != nil {
		f.Close()
		return "", err
	}
	return token, f.Close()
}

// readToken reads the token from f, an existing file at path, once it has
// checked that only euid could have chosen it.
func readToken(f *os.File, path string, euid int) (string, bool, error) {
	fi, err := f.Stat()
	if err != nil {
		return "", false, fmt.Errorf("reading the authorization token file: %w", err)
	}
	if !fi.Mode().IsRegular() {
		return "", false, fmt.Errorf("the authorization token file %s is not a regular file (%s); remove it to have one generated", path, fi.Mode().Type())
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok && int(st.Uid) != euid {
		return "", false, fmt.Errorf("the authorization token file %s is owned by uid %d, not by the user running the helper (uid %d): its owner could have written a token they know; remove it to have one generated, or chown it to uid %d", path, st.Uid, euid, euid)
	}
	if perm := fi.Mode().Perm(); perm&0o077 != 0 {
		return "", false, fmt.Errorf("the authorization token file %s has mode %04o, open to group or others: anyone who can write it chooses the token, anyone who can read it gets the credential; chmod 600 %s, or remove it to have one generated", path, perm, path)
	}
	b, err := io.ReadAll(io.LimitReader(f, 4096))
	if err != nil {
		return "", false, fmt.Errorf("reading the authorization token file: %w", err)
	}
	token := string(b)
	if strings.TrimSpace(token) != token {
		return "", false, fmt.Errorf("the authorization token in %s starts or ends with white space (a newline, say), which SDKs send as is and botocore refuses; write it without one, or remove the file to have one generated", path)
	}
	if len(token) < 16 {
		return "", false, fmt.Errorf("the authorization token in %s is shorter than 16 characters; remove the file to have one generated", path)
	}
	return token, false, nil
}

// createError explains why the token file could not be created.
func createError(path string, err error) error {
	dir := filepath.Dir(path)
	switch {
	case errors.Is(err, os.ErrNotExist):
		return fmt.Errorf("cannot create the authorization token file %s: the directory %s does not exist; create it first (mkdir -p -m 0700 %s, owned by the user the helper runs as) or give --auth-token-file a path in an existing directory", path, dir, dir)
	case errors.Is(err, os.ErrExist):
		return fmt.Errorf("cannot create the authorization token file %s: something appeared there (a dangling symbolic link?), which is never followed; remove it", path)
	case errors.Is(err, os.ErrPermission):
		return fmt.Errorf("cannot create the authorization token file %s: the user running the helper (uid %d) may not write in %s; give --auth-token-file a path in a directory it owns", path, os.Geteuid(), dir)
	}
	return fmt.Errorf("creating the authorization token file: %w", err)
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
