package awsresilient

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/hashicorp/vault/sdk/framework"
	"github.com/hashicorp/vault/sdk/helper/errutil"
	"github.com/hashicorp/vault/sdk/logical"
)

// HandleExistenceCheck is framework.Backend's, except that a value that
// does not convert to its field's type gets inputError's message. Vault
// runs the existence check of a write (roles/, config/root) before the
// request itself, and the framework's answer there is the bare converter
// text, without the field's help.
func (b *backend) HandleExistenceCheck(ctx context.Context, req *logical.Request) (bool, bool, error) {
	if msg := b.inputError(req); msg != "" {
		return false, false, errutil.UserError{Err: msg}
	}
	return b.Backend.HandleExistenceCheck(ctx, req)
}

// inputError returns a 400 message for the first field of req, by name,
// whose value does not convert to the field's type: it names the field,
// the value given, what the field takes and the field's description. It
// returns "" when every value converts, and for a path or operation the
// framework answers itself (no route, help). A request without data, every
// creds read, costs one length check.
func (b *backend) inputError(req *logical.Request) string {
	if len(req.Data) == 0 || req.Operation == logical.HelpOperation {
		return ""
	}
	p := b.Route(req.Path)
	if p == nil {
		return ""
	}
	names := make([]string, 0, len(req.Data))
	for name := range req.Data {
		// A name the path captures (roles/<name>) is taken from the URL,
		// whatever the body says.
		if p.Fields[name] != nil && !strings.Contains(p.Pattern, "(?P<"+name+">") {
			names = append(names, name)
		}
	}
	sort.Strings(names)
	for _, name := range names {
		// The sdk decodes a number field weakly: JSON true would be taken as
		// 1 and false as 0 ({"max_retries": true} stored as 1), so a
		// boolean is refused here, from the raw data, before it converts.
		_, isBool := req.Data[name].(bool)
		fd := framework.FieldData{Raw: map[string]interface{}{name: req.Data[name]}, Schema: p.Fields}
		if _, _, err := fd.GetOkErr(name); err != nil || (isBool && isNumberField(p.Fields[name].Type)) {
			return conversionMessage(name, p.Fields[name], req.Data[name])
		}
	}
	return ""
}

// conversionMessage says that field does not take v: what it takes, what
// was given (never a secret field's value) and the field's description,
// which names the valid range.
func conversionMessage(name string, f *framework.FieldSchema, v interface{}) string {
	got := fmt.Sprint(v)
	if utf8.RuneCountInString(got) > 64 {
		got = string([]rune(got)[:64]) + "..."
	}
	given := fmt.Sprintf("got %q", got)
	if _, isBool := v.(bool); isBool {
		given = fmt.Sprintf("got %v, which is a boolean, not a number", v)
	}
	isInt := f.Type == framework.TypeInt || f.Type == framework.TypeInt64 || f.Type == framework.TypeDurationSecond
	if _, err := strconv.ParseInt(fmt.Sprint(v), 10, 64); isInt && errors.Is(err, strconv.ErrRange) {
		given += ", which is out of range" // a whole number all the same: say why it is refused
	}
	if f.DisplayAttrs != nil && f.DisplayAttrs.Sensitive {
		given = "got a value that is not (not shown: the field is secret)"
	}
	return fmt.Sprintf("%s takes %s; %s. %s: %s", name, fieldTakes(f.Type), given, name, f.Description)
}

// isNumberField reports whether a field of type t takes a number (or a
// duration, which may be given in seconds).
func isNumberField(t framework.FieldType) bool {
	switch t {
	case framework.TypeInt, framework.TypeInt64, framework.TypeFloat,
		framework.TypeDurationSecond, framework.TypeSignedDurationSecond:
		return true
	}
	return false
}

// fieldTakes says, for a newcomer, what a field of type t accepts: the
// sdk's converter rules, in words.
func fieldTakes(t framework.FieldType) string {
	switch t {
	case framework.TypeBool:
		return "true or false"
	case framework.TypeInt, framework.TypeInt64:
		return "a whole number"
	case framework.TypeFloat:
		return "a number, such as 0.5"
	case framework.TypeDurationSecond:
		return "a duration that is not negative: whole seconds (3600), a number with the unit s, m, h or d " +
			"(90s, 15m, 12h, 30d), or units combined (1h30m); there is no unit for months or years"
	case framework.TypeKVPairs:
		return "key=value pairs (repeat the parameter for each pair, or send a JSON object)"
	case framework.TypeCommaStringSlice, framework.TypeStringSlice:
		return "a list of strings (comma-separated, or a JSON array)"
	case framework.TypeString:
		return "a string"
	}
	return "a value of type " + t.String()
}

// refuseFractionalIntegers makes every operation of paths refuse a
// fractional number for an integer field ({"max_retries": 6.5}) with a
// 400 naming the field. The sdk decodes such a field weakly, so 6.5 would
// quietly become 6; JSON has no integer type, so only the value tells.
// Durations in seconds are integers too: {"ttl": 900.5} is refused, while
// a string such as "1.5h" still parses as a duration.
func refuseFractionalIntegers(paths []*framework.Path) {
	for _, p := range paths {
		for op, h := range p.Operations {
			po, ok := h.(*framework.PathOperation)
			if !ok || po.Callback == nil {
				continue
			}
			next := po.Callback
			po.Callback = func(ctx context.Context, req *logical.Request, data *framework.FieldData) (*logical.Response, error) {
				if msg := fractionalIntegers(data); msg != "" {
					return logical.ErrorResponse(msg), nil
				}
				return next(ctx, req, data)
			}
			p.Operations[op] = po
		}
	}
}

// fractionalIntegers returns a message naming the integer fields of data
// sent as numbers with a fraction, or "" when there are none.
func fractionalIntegers(data *framework.FieldData) string {
	if data == nil {
		return ""
	}
	var bad []string
	for name, v := range data.Raw {
		f, ok := data.Schema[name]
		if !ok {
			continue
		}
		switch f.Type {
		case framework.TypeInt, framework.TypeInt64, framework.TypeDurationSecond:
		default:
			continue
		}
		if x, ok := number(v); ok && x != math.Trunc(x) {
			bad = append(bad, fmt.Sprintf("%s (got %v)", name, v))
		}
	}
	if len(bad) == 0 {
		return ""
	}
	sort.Strings(bad)
	return "these fields take a whole number, not a fraction: " + strings.Join(bad, ", ")
}

// number returns v as a float64 when it is a JSON number (as the sdk may
// receive one: float64, or json.Number).
func number(v interface{}) (float64, bool) {
	switch x := v.(type) {
	case float64:
		return x, true
	case float32:
		return float64(x), true
	case json.Number:
		f, err := x.Float64()
		return f, err == nil
	}
	return 0, false
}

// unsupportedOperation is the answer to an operation that a path of the
// plugin does not take (vault read config/rotate-root): still a 405, but
// instead of Vault's bare "unsupported operation" it names the operations
// the path takes and where its help is. nil for a path that is not the
// plugin's.
func (b *backend) unsupportedOperation(req *logical.Request) error {
	p := b.Route(req.Path)
	if p == nil {
		return nil
	}
	var takes []string
	seen := map[string]bool{}
	for op := range p.Operations {
		if v := operationVerb(op); !seen[v] {
			seen[v] = true
			takes = append(takes, v)
		}
	}
	sort.Strings(takes)
	path := req.MountPoint + req.Path
	return logical.CodedError(http.StatusMethodNotAllowed, fmt.Sprintf("%s does not take %s; it takes %s (vault path-help %s says what each does)",
		path, operationVerb(req.Operation), strings.Join(takes, ", "), path))
}

// operationVerb names op as the vault CLI command that sends it.
func operationVerb(op logical.Operation) string {
	switch op {
	case logical.ReadOperation:
		return "read (vault read)"
	case logical.CreateOperation, logical.UpdateOperation:
		return "write (vault write)"
	case logical.DeleteOperation:
		return "delete (vault delete)"
	case logical.ListOperation:
		return "list (vault list)"
	case logical.PatchOperation:
		return "patch (vault patch)"
	}
	return string(op)
}
