package awsresilient

import (
	"os"
	"sort"
	"strings"
	"testing"

	"github.com/hashicorp/vault/sdk/framework"
	"github.com/hashicorp/vault/sdk/logical"
)

// TestDocsAPICoversEveryPath derives docs/api.md's outline from the paths'
// framework definitions, so that nothing is missed: every operation of
// every production path has its "| `METHOD` | `/aws-resilient/path` |"
// line, and the section after it names every request field and every
// response field of that path in backquotes.
func TestDocsAPICoversEveryPath(t *testing.T) {
	raw, err := os.ReadFile("docs/api.md")
	if err != nil {
		t.Fatal(err)
	}
	doc := string(raw)
	b, _ := getTestBackend(t)
	methods := map[logical.Operation]string{
		logical.ReadOperation:   "GET",
		logical.CreateOperation: "POST",
		logical.UpdateOperation: "POST",
		logical.DeleteOperation: "DELETE",
		logical.ListOperation:   "LIST",
	}
	checked := 0
	for _, p := range b.Paths {
		path := docPath(p.Pattern)
		if strings.HasPrefix(path, "test/") {
			continue // test hooks: not in a production build
		}
		ops := make([]logical.Operation, 0, len(p.Operations))
		for op := range p.Operations {
			ops = append(ops, op)
		}
		sort.Slice(ops, func(i, j int) bool { return ops[i] < ops[j] })
		for _, op := range ops {
			method, ok := methods[op]
			if !ok {
				continue
			}
			line := "| `" + method + "` | `/aws-resilient/" + path + "` |"
			i := strings.Index(doc, line)
			if i < 0 {
				t.Errorf("docs/api.md lacks %s", line)
				continue
			}
			// The section: from its heading to the next one.
			start := strings.LastIndex(doc[:i], "\n## ")
			section := doc[start+1:]
			if j := strings.Index(section[1:], "\n## "); j >= 0 {
				section = section[:j+1]
			}
			// The request fields where they matter: the writes and lists.
			if op != logical.ReadOperation && op != logical.DeleteOperation {
				for name := range p.Fields {
					if !strings.Contains(section, "`"+name+"`") {
						t.Errorf("docs/api.md, %s %s: field %q not described", method, path, name)
					}
				}
			}
			// The response fields of reads, where the samples are.
			if op == logical.ReadOperation || op == logical.ListOperation {
				for _, rs := range p.Operations[op].Properties().Responses {
					for _, r := range rs {
						for name := range r.Fields {
							if !strings.Contains(section, `"`+name+`"`) && !strings.Contains(section, "`"+name+"`") {
								t.Errorf("docs/api.md, %s %s: response field %q not shown", method, path, name)
							}
						}
					}
				}
			}
			checked++
		}
	}
	if checked < 14 {
		t.Fatalf("checked %d operations; the backend has more", checked)
	}
}

// docPath turns a path pattern into its API-doc form: roles/:name.
func docPath(pattern string) string {
	p := strings.Replace(pattern, framework.GenericNameRegex("name"), ":name", 1)
	p = strings.TrimSuffix(p, "$")
	p = strings.TrimSuffix(p, "/?")
	return p
}
