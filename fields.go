package awsresilient

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"sort"
	"strings"

	"github.com/hashicorp/vault/sdk/framework"
	"github.com/hashicorp/vault/sdk/logical"
)

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
