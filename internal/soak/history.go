// Package soak holds the chaos soak's records and the checker that proves
// from them, after the run, that no guarantee of the plugin was broken.
//
// A soak run (scripts/soak.sh, `make soak`) writes two logs: the client
// history, one Op per line, recorded by the driver for every read, operator
// action, fault, sample of Vault Agent's file and call of the AWS client
// that uses that file; and the emulator's log of every STS and IAM call it
// answered (stsemu.Call), which names every credential it issued, every IAM
// key it created or deleted and the listener (the "region") each call came
// through. The link proxy that carries the nodes' STS traffic also logs
// each exchange (Exchange: when the request reached the link, when the
// answer's last byte reached the node). Check reads the first two,
// CheckLinks all three, and reports each violation with the operations
// involved, plus the run's figures.
//
// Times are wall-clock times of one host (the driver and the emulator run
// side by side), compared directly.
package soak

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"time"
)

// The kinds of Op.
const (
	KindRead       = "read"        // GET <mount>/creds/<role>
	KindRoleWrite  = "role_write"  // write roles/<role> (creates it, or changes role_arn/lease)
	KindRoleDelete = "role_delete" // delete roles/<role>
	KindRootWrite  = "root_write"  // write config/root with an operator's key (AccessKey)
	KindRotate     = "rotate_root" // config/rotate-root, or a scheduled rotation seen in config/rotation
	KindRefreshCfg = "refresh_config"
	KindAgentFile  = "agent_file" // a sample of the file Vault Agent renders
	KindFault      = "fault"      // an injected fault; its window is [Invoke, Return]
	KindSample     = "sample"     // a resource sample (RSS)
	// KindAWSClient is one call of an independent AWS client (the awscli's
	// sts get-caller-identity) signed with the credential of Vault Agent's
	// file: AccessKey and Expiration are the file's, ARN the identity STS
	// answered, OK whether the call succeeded.
	KindAWSClient = "aws_client"
)

// Faults that stop a node or plugin: reads failing inside their windows
// (plus Grace, or RestartGrace after a cluster restart) are attributed to
// an election, a plugin restart or the cluster's restart.
const (
	FaultKillPlugin = "kill_plugin"
	FaultKillActive = "kill_active"
	// FaultClusterRestart stops every node (Detail "stop": SIGTERM; "kill":
	// SIGKILL) and starts and unseals them again; its window ends when the
	// cluster has re-formed (one node active, the others standbys).
	FaultClusterRestart = "cluster_restart"
	FaultStepDown       = "step_down"
)

// FaultRegionDown takes the emulator's listener named by Endpoint down
// (Detail "refused": connections refused; "unavailable": every call 503)
// while the fallback listener, the same STS and IAM, stays up.
const FaultRegionDown = "region_down"

// The network's faults (the soak's nodes each in a network namespace,
// their STS traffic through a link proxy; internal/vaulttest's Network and
// LinkProxy).
const (
	// FaultPartition cuts the nodes named by Nodes (the minority) off from
	// the others (Detail: "isolate_active", "isolate_standby" or "split");
	// every node still reaches STS and the clients.
	FaultPartition = "partition"
	// FaultSTSLink is a fault of one node's link to STS and IAM (Node;
	// Detail names it: "latency_<d>", "loss_<n>pct", "reset_mid_response",
	// "bandwidth_<n>Bps", "cut"); the other nodes' links and every client's
	// are untouched.
	FaultSTSLink = "sts_link"
	// FaultClockStep steps AWS's clock (the emulator's) by ClockOffset for
	// the fault's window, and back at its end.
	FaultClockStep = "aws_clock_step"
)

// The kinds of op that describe the cluster rather than act on it.
const (
	// KindNodeState is a change of a node's state as its sys/health
	// answered (Node, Detail: active, standby, sealed, down, no_answer...);
	// Invoke is when the answer came.
	KindNodeState = "node_state"
	// KindTopology names the addresses each node's STS and IAM calls come
	// from (Addrs: address -> node), so that the emulator's call log
	// (STSCall.Source) tells whose call each was.
	KindTopology = "topology"
)

// Op is one operation of the history.
type Op struct {
	ID     int64  `json:"id"`
	Client string `json:"client"`
	Kind   string `json:"kind"`
	Role   string `json:"role,omitempty"`
	// Entity is the Vault entity ID of an entity-scoped read, "" for a
	// role-scoped one.
	Entity string `json:"entity,omitempty"`
	// RoleARN is the role_arn a role_write wrote.
	RoleARN string    `json:"role_arn,omitempty"`
	Invoke  time.Time `json:"invoke"`
	Return  time.Time `json:"return"`
	// InvokeMono and ReturnMono are the same instants on the driver's
	// monotonic clock, in nanoseconds since the run began: durations and
	// order that a wall-clock step cannot disturb.
	InvokeMono int64 `json:"invoke_mono_ns"`
	ReturnMono int64 `json:"return_mono_ns"`
	// Status is the HTTP status of the answer, 0 when none came.
	Status int `json:"status,omitempty"`
	// OK: a read returned a credential; an operator action was
	// acknowledged by Vault.
	OK bool `json:"ok"`
	// AccessKey, Expiration and ARN describe the credential a read returned
	// or the agent's file held; AccessKey is also the key a root_write wrote.
	AccessKey  string    `json:"access_key,omitempty"`
	Expiration time.Time `json:"expiration,omitempty"`
	ARN        string    `json:"arn,omitempty"`
	Error      string    `json:"error,omitempty"`
	// Fault names the fault of a fault op, and Detail how it was made (see
	// FaultClusterRestart, FaultRegionDown).
	Fault  string `json:"fault,omitempty"`
	Detail string `json:"detail,omitempty"`
	// Endpoint is the emulator listener a region_down took down, host:port
	// as the call log's STSCall.Listener names it.
	Endpoint string `json:"endpoint,omitempty"`
	// Value is a sample's value (RSS in bytes).
	Value float64 `json:"value,omitempty"`
	// Node is the node a read went through, whose state a node_state op
	// records, whose STS link an sts_link fault breaks, or that Vault
	// Agent asks (agent_file).
	Node string `json:"node,omitempty"`
	// Nodes are the nodes a partition cut off from the rest (the
	// minority).
	Nodes []string `json:"nodes,omitempty"`
	// ClockOffset is AWS's clock minus the host's during an
	// aws_clock_step.
	ClockOffset time.Duration `json:"clock_offset,omitempty"`
	// Addrs maps each source address of STS calls to its node (topology).
	Addrs map[string]string `json:"addrs,omitempty"`
	// Redirected: the node a read (or an operator action) was sent to
	// answered 307 and the request was sent once more to the node its
	// Location named, as Vault's own client does; ServedBy is the node
	// that gave the final answer (Node when not redirected; "" when no
	// answer came).
	Redirected bool   `json:"redirected,omitempty"`
	ServedBy   string `json:"served_by,omitempty"`
	// Wait is how long a successful agent_read set Vault Agent to wait
	// before its next read: 85-95 % of the lease the plugin gave it.
	Wait time.Duration `json:"wait,omitempty"`
	// SourceRole is the source_role a role_write wrote: the hub role
	// whose credential the role's AssumeRole is signed with ("" for a role
	// signed with the root key).
	SourceRole string `json:"source_role,omitempty"`
}

// Duration is how long the op took.
func (o Op) Duration() time.Duration { return o.Return.Sub(o.Invoke) }

func (o Op) String() string {
	s := fmt.Sprintf("#%d %s %s", o.ID, o.Client, o.Kind)
	if o.Role != "" {
		s += " role=" + o.Role
	}
	if o.Entity != "" {
		s += " entity=" + o.Entity
	}
	if o.Fault != "" {
		s += " fault=" + o.Fault
	}
	if o.Detail != "" {
		s += " (" + o.Detail + ")"
	}
	if o.Endpoint != "" {
		s += " endpoint=" + o.Endpoint
	}
	if o.Node != "" {
		s += " node=" + o.Node
	}
	if len(o.Nodes) > 0 {
		s += fmt.Sprintf(" cut off=%v", o.Nodes)
	}
	if o.ClockOffset != 0 {
		s += " aws_clock=" + signed(o.ClockOffset)
	}
	s += fmt.Sprintf(" [%s .. %s]", o.Invoke.Format("15:04:05.000"), o.Return.Format("15:04:05.000"))
	switch {
	case o.Kind == KindAWSClient && o.OK:
		s += fmt.Sprintf(" file key=%s expires=%s: ok %s", o.AccessKey, o.Expiration.Format("15:04:05"), o.ARN)
	case o.Kind == KindAWSClient:
		s += fmt.Sprintf(" file key=%s expires=%s: err=%q", o.AccessKey, o.Expiration.Format("15:04:05"), o.Error)
	case o.Kind == KindAgentRead && o.OK:
		s += " next read after " + o.Wait.Round(time.Millisecond).String()
	case o.Kind == KindAgentRead:
		s += fmt.Sprintf(" status=%d err=%q", o.Status, o.Error)
	case o.Kind == KindAgentFile || (o.Kind == KindRead && o.OK):
		s += fmt.Sprintf(" key=%s expires=%s", o.AccessKey, o.Expiration.Format("15:04:05"))
	case o.Kind == KindRead:
		s += fmt.Sprintf(" status=%d err=%q", o.Status, o.Error)
	case !o.OK:
		s += " (not acknowledged)"
	}
	return s
}

// STSCall is one call the emulator answered, as its call log records it.
type STSCall struct {
	Time    time.Time `json:"time"`
	Action  string    `json:"action"`
	Outcome string    `json:"outcome"`
	RoleArn string    `json:"role_arn"`
	// AccessKeyID is the key that signed the call.
	AccessKeyID     string `json:"access_key_id"`
	RoleSessionName string `json:"role_session_name"`
	SourceIdentity  string `json:"source_identity"`
	// IssuedKeyID and IssuedExpiration name the credential an STS call
	// issued; for CreateAccessKey and DeleteAccessKey IssuedKeyID is the
	// IAM key created or deleted.
	IssuedKeyID      string    `json:"issued_key_id"`
	IssuedExpiration time.Time `json:"issued_expiration"`
	// Listener is the emulator listener the call came through (host:port).
	Listener string `json:"listener"`
	// Source is the caller's address: a node's (through the topology op),
	// or a client's.
	Source string `json:"source,omitempty"`
	// ClockOffset is AWS's clock (the emulator's) minus the host's when the
	// call arrived. The log's time is AWS's; ReadCalls makes Time the
	// host's, comparable with the history's, and keeps AWS's in AWSTime.
	ClockOffset time.Duration `json:"clock_offset,omitempty"`
	AWSTime     time.Time     `json:"-"`
}

// signed formats d with its sign.
func signed(d time.Duration) string {
	if d > 0 {
		return "+" + d.String()
	}
	return d.String()
}

// ReadOps reads a history, one JSON Op per line.
func ReadOps(r io.Reader) ([]Op, error) {
	var ops []Op
	err := readLines(r, func(b []byte) error {
		var o Op
		if err := json.Unmarshal(b, &o); err != nil {
			return err
		}
		ops = append(ops, o)
		return nil
	})
	return ops, err
}

// ReadCalls reads an emulator call log, one JSON STSCall per line.
func ReadCalls(r io.Reader) ([]STSCall, error) {
	var calls []STSCall
	err := readLines(r, func(b []byte) error {
		var c STSCall
		if err := json.Unmarshal(b, &c); err != nil {
			return err
		}
		c.AWSTime, c.Time = c.Time, c.Time.Add(-c.ClockOffset)
		calls = append(calls, c)
		return nil
	})
	return calls, err
}

func readLines(r io.Reader, each func([]byte) error) error {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 4<<20)
	n := 0
	for sc.Scan() {
		n++
		if len(sc.Bytes()) == 0 {
			continue
		}
		if err := each(sc.Bytes()); err != nil {
			return fmt.Errorf("line %d: %w", n, err)
		}
	}
	return sc.Err()
}
