package awsresilient

import (
	"context"
	"fmt"
	"math"
	"net"
	"net/http"
	"net/url"
	"regexp"
	"strings"
	"time"

	"github.com/hashicorp/vault/sdk/framework"
	"github.com/hashicorp/vault/sdk/logical"
)

const defaultRegion = "us-east-1"

// Ranges of config/refresh, named in every 400 a bad value gets.
const (
	defaultMaxRetries      = 6
	minMaxRetries          = 1
	maxMaxRetries          = 20
	defaultRetryWindow     = 30 * time.Second
	minRetryWindow         = time.Second
	maxRetryWindow         = 10 * time.Minute
	defaultRefreshFraction = 0.33
	minRefreshFraction     = 0.05
	maxRefreshFraction     = 0.9
	defaultSTSRateLimit    = 10.0
	minSTSRateLimit        = 0.01 // one call per 100 s; below that burst × interval overflows
	maxSTSRateLimit        = 10000.0
	defaultSTSBurst        = 10
	maxSTSBurst            = 10000
	maxFallbackEndpoints   = 10
	// rotation_period: at least an hour (IAM keys are not meant to churn;
	// a -tags testhooks build may lower it for the acceptance tests), at
	// most a year.
	defaultMinRotationPeriod = time.Hour
	maxRotationPeriod        = 8760 * time.Hour
	defaultMetricsMaxRoles   = 1000 // scrape cost per size: docs/monitoring.md
	maxMetricsMaxRoles       = 100000
	// max_entity_credentials: a cached entity credential costs about as
	// much memory as a role's, and 100 000 roles fit in some 220 MiB.
	defaultMaxEntityCredentials = 100000
	maxMaxEntityCredentials     = 10000000

	// Cross-field bounds of config/refresh.
	//
	// minRetryBlock: one STS call may take 4/5 of a block, and a timeout
	// under ~1s fails calls that STS answers normally.
	minRetryBlock = time.Second
	// maxRetryBlock: a cold read waits at most Vault's request timeout
	// (max_request_duration, 90s by default); its first attempt goes at once
	// and its first retry lands within two blocks, which must fit.
	maxRetryBlock = 45 * time.Second
	// shortestLifetime is the shortest credential STS issues (900s). Its
	// refresh margin, refresh_fraction × 900s less the start delay of up to
	// 10% of it, must hold a whole retry window, or a failing cycle could not
	// finish before that credential expires.
	shortestLifetime = 15 * time.Minute
)

// regionRegex matches AWS region names: us-east-1, us-gov-west-1, cn-north-1,
// us-isob-east-1, ...
var regionRegex = regexp.MustCompile(`^[a-z]{2}(-[a-z]+)+-[0-9]{1,2}$`)

func pathConfigRoot(b *backend) *framework.Path {
	// Create and update are the same write.
	configure := &framework.PathOperation{
		Callback:                    b.pathConfigRootWrite,
		Summary:                     "Configure how the plugin reaches STS.",
		ForwardPerformanceStandby:   true,
		ForwardPerformanceSecondary: true,
		DisplayAttrs: &framework.DisplayAttributes{
			OperationVerb:   "configure",
			OperationSuffix: "root",
		},
		Responses: map[int][]framework.Response{
			http.StatusOK: {{Description: "The configuration as stored; the secret key is never returned", Fields: configRootResponseFields}},
		},
	}
	return &framework.Path{
		Pattern: "config/root",
		DisplayAttrs: &framework.DisplayAttributes{
			OperationPrefix: operationPrefixAWSResilient,
		},
		Fields: map[string]*framework.FieldSchema{
			"access_key": {
				Type:        framework.TypeString,
				Description: "AWS access key id used to call STS. Leave unset (with secret_key) to use the default AWS credential chain.",
			},
			"secret_key": {
				Type:         framework.TypeString,
				Description:  "AWS secret access key paired with access_key. Never returned by a read.",
				DisplayAttrs: &framework.DisplayAttributes{Sensitive: true},
			},
			"region": {
				Type:        framework.TypeString,
				Description: "AWS region for STS calls and request signing.",
				Default:     defaultRegion,
			},
			"sts_endpoint": {
				Type:        framework.TypeString,
				Description: "STS endpoint URL; empty means the SDK's default for the region. Must be https, except on a loopback address (127.0.0.0/8, ::1, localhost).",
			},
			"sts_region": {
				Type:        framework.TypeString,
				Description: "Region used to sign calls to sts_endpoint; defaults to region.",
			},
			"sts_fallback_endpoints": {
				Type:        framework.TypeCommaStringSlice,
				Description: "STS endpoints tried in order after a retryable failure of sts_endpoint, within the same attempt.",
			},
			"sts_fallback_regions": {
				Type:        framework.TypeCommaStringSlice,
				Description: "Signing regions of sts_fallback_endpoints, in the same order; empty means sts_region for all of them.",
			},
			"iam_endpoint": {
				Type:        framework.TypeString,
				Description: "IAM endpoint URL for root key rotation; empty means the IAM endpoint of iam_region's partition (iam.amazonaws.com, iam.us-gov.amazonaws.com or iam.cn-north-1.amazonaws.com.cn). Must be https, except on a loopback address.",
			},
			"iam_region": {
				Type:        framework.TypeString,
				Description: "Region that root key rotation signs IAM calls for; empty means the IAM region of region's partition: us-east-1 (aws), us-gov-west-1 (aws-us-gov) or cn-north-1 (aws-cn).",
			},
			"rotation_period": {
				Type:        framework.TypeDurationSecond,
				Description: "Rotate the static access key when it is this old (at a random moment in the last tenth of the period); 0 turns scheduled rotation off. At least 1h, at most 8760h (a year).",
			},
		},
		ExistenceCheck: b.pathConfigRootExistenceCheck,
		Operations: map[logical.Operation]framework.OperationHandler{
			logical.ReadOperation: &framework.PathOperation{
				Callback: b.pathConfigRootRead,
				Summary:  "Read the STS connection configuration; the secret key is never returned.",
				DisplayAttrs: &framework.DisplayAttributes{
					OperationVerb:   "read",
					OperationSuffix: "root-configuration",
				},
				Responses: map[int][]framework.Response{
					http.StatusOK: {{
						Description: "OK",
						Fields:      configRootResponseFields,
					}},
				},
			},
			logical.CreateOperation: configure,
			logical.UpdateOperation: configure,
			logical.DeleteOperation: &framework.PathOperation{
				Callback:                    b.pathConfigRootDelete,
				Summary:                     "Delete the STS connection configuration; the default credential chain is used afterwards.",
				ForwardPerformanceStandby:   true,
				ForwardPerformanceSecondary: true,
				DisplayAttrs: &framework.DisplayAttributes{
					OperationVerb:   "delete",
					OperationSuffix: "root-configuration",
				},
				Responses: map[int][]framework.Response{
					http.StatusNoContent: {{Description: "No Content"}},
				},
			},
		},
		HelpSynopsis:    pathConfigRootHelpSyn,
		HelpDescription: pathConfigRootHelpDesc,
	}
}

var configRootResponseFields = map[string]*framework.FieldSchema{
	"access_key":             {Type: framework.TypeString, Description: "AWS access key id; empty when the default credential chain is used.", Required: true},
	"iam_endpoint":           {Type: framework.TypeString, Description: "IAM endpoint URL for root key rotation; empty means the IAM endpoint of iam_region's partition.", Required: true},
	"iam_region":             {Type: framework.TypeString, Description: "Signing region of IAM calls as configured; empty means derived from region's partition.", Required: true},
	"rotation_period":        {Type: framework.TypeDurationSecond, Description: "Scheduled rotation period in seconds; 0 when off.", Required: true},
	"last_rotated":           {Type: framework.TypeString, Description: "When the access key was last rotated (RFC 3339); empty if never.", Required: true},
	"next_rotation":          {Type: framework.TypeString, Description: "When the next scheduled rotation is due (RFC 3339); empty when rotation_period is 0.", Required: true},
	"aws_clocks":             {Type: framework.TypeMap, Description: "This node's estimate of AWS's clock per endpoint (STS endpoints, IAM), from the Date of their answers: offset (seconds AWS is ahead of this host; negative: behind), error (the most it can be off), samples (agreeing answers it rests on), odd_samples (answers set aside as disagreeing), age (seconds since the newest; -1 when not measured) basis (measured: from answers since this node started; stored: this host's estimate persisted before the plugin last stopped, which no answer has confirmed yet; unmeasured: none yet, this host's clock taken as up to 5 minutes off) date_not_aws (answers whose Date a signature AWS accepted proved not to be AWS's clock) and date_is_aws (false once the endpoint's Date was found not to be AWS's clock, from the issue times STS writes into credentials: a proxy in front of STS dating answers by its own; basis is then measured_issue_times). Credentials are judged and requests signed on these clocks."},
	"secret_key_set":         {Type: framework.TypeBool, Description: "Whether a secret key is stored.", Required: true},
	"region":                 {Type: framework.TypeString, Description: "AWS region.", Required: true},
	"sts_endpoint":           {Type: framework.TypeString, Description: "STS endpoint URL.", Required: true},
	"sts_region":             {Type: framework.TypeString, Description: "Signing region of sts_endpoint.", Required: true},
	"sts_fallback_endpoints": {Type: framework.TypeCommaStringSlice, Description: "Fallback STS endpoints, in order.", Required: true},
	"sts_fallback_regions":   {Type: framework.TypeCommaStringSlice, Description: "Signing regions of the fallback endpoints.", Required: true},
}

func pathConfigRefresh(b *backend) *framework.Path {
	return &framework.Path{
		Pattern: "config/refresh",
		DisplayAttrs: &framework.DisplayAttributes{
			OperationPrefix: operationPrefixAWSResilient,
		},
		Fields: map[string]*framework.FieldSchema{
			"max_retries": {
				Type:        framework.TypeInt,
				Description: fmt.Sprintf("Attempts per refresh cycle, %d to %d.", minMaxRetries, maxMaxRetries),
				Default:     defaultMaxRetries,
			},
			"retry_window": {
				Type:        framework.TypeDurationSecond,
				Description: "Length of one refresh cycle, split into max_retries equal blocks with one attempt at a random time in each; 1s to 10m, with each block 1s to 45s and the window at most refresh_fraction × 810s.",
				Default:     int(defaultRetryWindow / time.Second),
			},
			"refresh_fraction": {
				Type:        framework.TypeFloat,
				Description: fmt.Sprintf("Refresh when the remaining validity falls below this fraction of the issued lifetime, %g to %g.", minRefreshFraction, maxRefreshFraction),
				Default:     defaultRefreshFraction,
			},
			"sts_rate_limit": {
				Type:        framework.TypeFloat,
				Description: fmt.Sprintf("Cap on STS calls per second across all roles, %g to %g, or 0 for no cap.", minSTSRateLimit, maxSTSRateLimit),
				Default:     defaultSTSRateLimit,
			},
			"sts_burst": {
				Type:        framework.TypeInt,
				Description: fmt.Sprintf("STS calls allowed at once above sts_rate_limit after a quiet period, 1 to %d (0 only without a rate limit).", maxSTSBurst),
				Default:     defaultSTSBurst,
			},
			"metrics_max_roles": {
				Type:        framework.TypeInt,
				Description: fmt.Sprintf("Most roles for which the metrics path exports per-role series, 0 to %d; with more roles only aggregates are exported.", maxMetricsMaxRoles),
				Default:     defaultMetricsMaxRoles,
			},
			"max_entity_credentials": {
				Type: framework.TypeInt,
				Description: fmt.Sprintf("Most entity credentials (cache_scope=entity) the mount caches across all roles, "+
					"0 to %d (0: no cap, each role's max_entities alone applies). A new entity beyond it evicts its role's "+
					"least recently read credential unread for entity_idle_ttl, or is refused with a 400.", maxMaxEntityCredentials),
				Default: defaultMaxEntityCredentials,
			},
		},
		Operations: map[logical.Operation]framework.OperationHandler{
			logical.ReadOperation: &framework.PathOperation{
				Callback: b.pathConfigRefreshRead,
				Summary:  "Read the refresh and retry policy.",
				DisplayAttrs: &framework.DisplayAttributes{
					OperationVerb:   "read",
					OperationSuffix: "refresh-configuration",
				},
				Responses: map[int][]framework.Response{
					http.StatusOK: {{
						Description: "OK",
						Fields:      configRefreshResponseFields,
					}},
				},
			},
			logical.UpdateOperation: &framework.PathOperation{
				Callback:                    b.pathConfigRefreshWrite,
				Summary:                     "Change the refresh and retry policy; cycles that start afterwards use it.",
				ForwardPerformanceStandby:   true,
				ForwardPerformanceSecondary: true,
				DisplayAttrs: &framework.DisplayAttributes{
					OperationVerb:   "configure",
					OperationSuffix: "refresh",
				},
				Responses: map[int][]framework.Response{
					http.StatusOK: {{Description: "The policy as stored", Fields: configRefreshResponseFields}},
				},
			},
		},
		HelpSynopsis:    pathConfigRefreshHelpSyn,
		HelpDescription: pathConfigRefreshHelpDesc,
	}
}

var configRefreshResponseFields = map[string]*framework.FieldSchema{
	"max_retries":            {Type: framework.TypeInt, Description: "Attempts per refresh cycle.", Required: true},
	"retry_window":           {Type: framework.TypeDurationSecond, Description: "Length of one refresh cycle, in seconds.", Required: true},
	"retry_block":            {Type: framework.TypeFloat, Description: "retry_window / max_retries, in seconds (may be fractional).", Required: true},
	"refresh_fraction":       {Type: framework.TypeFloat, Description: "Fraction of the issued lifetime left when a refresh starts.", Required: true},
	"sts_rate_limit":         {Type: framework.TypeFloat, Description: "Cap on STS calls per second; 0 means no cap.", Required: true},
	"sts_burst":              {Type: framework.TypeInt, Description: "Burst above sts_rate_limit.", Required: true},
	"metrics_max_roles":      {Type: framework.TypeInt, Description: "Most roles with per-role metrics series.", Required: true},
	"max_entity_credentials": {Type: framework.TypeInt, Description: "Most entity credentials the mount caches; 0 for no cap.", Required: true},
}

func (b *backend) pathConfigRootExistenceCheck(ctx context.Context, req *logical.Request, _ *framework.FieldData) (bool, error) {
	cfg, err := getRootConfig(ctx, req.Storage)
	if err != nil {
		return false, err
	}
	return cfg != nil, nil
}

func (b *backend) pathConfigRootRead(ctx context.Context, req *logical.Request, _ *framework.FieldData) (*logical.Response, error) {
	cfg, err := getRootConfig(ctx, req.Storage)
	if err != nil {
		return nil, err
	}
	rot, err := getRotationState(ctx, req.Storage)
	if err != nil {
		return nil, err
	}
	if cfg == nil {
		cfg = defaultRootConfig()
	}
	return &logical.Response{Data: map[string]interface{}{
		"access_key":             cfg.AccessKey,
		"secret_key_set":         cfg.SecretKey != "",
		"region":                 cfg.Region,
		"sts_endpoint":           cfg.STSEndpoint,
		"sts_region":             cfg.STSRegion,
		"sts_fallback_endpoints": nonNil(cfg.STSFallbackEndpoints),
		"sts_fallback_regions":   nonNil(cfg.STSFallbackRegions),
		"iam_endpoint":           cfg.IAMEndpoint,
		"iam_region":             cfg.IAMRegion,
		"rotation_period":        int64(cfg.RotationPeriod / time.Second),
		"last_rotated":           formatTime(rot.LastRotated),
		"next_rotation":          formatTime(rot.NextRotation),
		"aws_clocks":             b.clients.awsTime().clocksView(),
	}}, nil
}

func (b *backend) pathConfigRootWrite(ctx context.Context, req *logical.Request, data *framework.FieldData) (*logical.Response, error) {
	msg, err := b.rotator.writeRoot(ctx, req.Storage, func(cfg *rootConfig) string {
		if v, ok := data.GetOk("access_key"); ok {
			cfg.AccessKey = strings.TrimSpace(v.(string))
		}
		if v, ok := data.GetOk("secret_key"); ok {
			cfg.SecretKey = strings.TrimSpace(v.(string))
		}
		if v, ok := data.GetOk("region"); ok {
			cfg.Region = strings.TrimSpace(v.(string))
		}
		if v, ok := data.GetOk("sts_endpoint"); ok {
			cfg.STSEndpoint = strings.TrimSpace(v.(string))
		}
		if v, ok := data.GetOk("sts_region"); ok {
			cfg.STSRegion = strings.TrimSpace(v.(string))
		}
		if v, ok := data.GetOk("sts_fallback_endpoints"); ok {
			cfg.STSFallbackEndpoints = trimAll(v.([]string))
		}
		if v, ok := data.GetOk("sts_fallback_regions"); ok {
			cfg.STSFallbackRegions = trimAll(v.([]string))
		}
		if v, ok := data.GetOk("iam_endpoint"); ok {
			cfg.IAMEndpoint = strings.TrimSpace(v.(string))
		}
		if v, ok := data.GetOk("iam_region"); ok {
			cfg.IAMRegion = strings.TrimSpace(v.(string))
		}
		if v, ok := data.GetOk("rotation_period"); ok {
			cfg.RotationPeriod = time.Duration(v.(int)) * time.Second
		}
		return cfg.validate()
	})
	if err != nil {
		return nil, err
	}
	if msg != "" {
		return logical.ErrorResponse(msg), nil
	}
	b.rootChanged()
	return b.writtenAnswer(ctx, req, b.pathConfigRootRead), nil
}

// writtenAnswer answers a successful write with what a read returns now, so
// that the sdk's warning about fields it ignored (a mistyped tll=2h) reaches
// the caller: Vault drops the warnings of an empty answer. The write has
// landed whatever the read does, so a failed read-back is a warning, never
// an error.
func (b *backend) writtenAnswer(ctx context.Context, req *logical.Request, read framework.OperationFunc) *logical.Response {
	resp, err := read(ctx, req, nil)
	if err != nil || resp == nil {
		resp = &logical.Response{}
		resp.AddWarning(fmt.Sprintf("written; reading it back failed: %v", err))
	}
	return resp
}

func (b *backend) pathConfigRootDelete(ctx context.Context, req *logical.Request, _ *framework.FieldData) (*logical.Response, error) {
	if err := b.rotator.deleteRoot(ctx, req.Storage); err != nil {
		return nil, err
	}
	b.rootChanged()
	return nil, nil
}

func (b *backend) pathConfigRefreshRead(ctx context.Context, req *logical.Request, _ *framework.FieldData) (*logical.Response, error) {
	cfg, err := getRefreshConfig(ctx, req.Storage)
	if err != nil {
		return nil, err
	}
	return &logical.Response{Data: map[string]interface{}{
		"max_retries":            cfg.MaxRetries,
		"retry_window":           int64(cfg.RetryWindow / time.Second),
		"retry_block":            cfg.block().Seconds(),
		"refresh_fraction":       cfg.RefreshFraction,
		"sts_rate_limit":         cfg.STSRateLimit,
		"sts_burst":              cfg.STSBurst,
		"metrics_max_roles":      cfg.MetricsMaxRoles,
		"max_entity_credentials": cfg.MaxEntityCredentials,
	}}, nil
}

func (b *backend) pathConfigRefreshWrite(ctx context.Context, req *logical.Request, data *framework.FieldData) (*logical.Response, error) {
	rule, err := b.settings.write(ctx, req.Storage, func(cfg *refreshConfig) string {
		if v, ok := data.GetOk("max_retries"); ok {
			cfg.MaxRetries = v.(int)
		}
		if v, ok := data.GetOk("retry_window"); ok {
			cfg.RetryWindow = time.Duration(v.(int)) * time.Second
		}
		if v, ok := data.GetOk("refresh_fraction"); ok {
			cfg.RefreshFraction = v.(float64)
		}
		if v, ok := data.GetOk("sts_rate_limit"); ok {
			cfg.STSRateLimit = v.(float64)
		}
		if v, ok := data.GetOk("sts_burst"); ok {
			cfg.STSBurst = v.(int)
		}
		if v, ok := data.GetOk("metrics_max_roles"); ok {
			cfg.MetricsMaxRoles = v.(int)
		}
		if v, ok := data.GetOk("max_entity_credentials"); ok {
			cfg.MaxEntityCredentials = v.(int)
		}
		return cfg.validate()
	})
	if err != nil {
		return nil, err
	}
	if rule != "" {
		return logical.ErrorResponse(rule), nil
	}
	return b.writtenAnswer(ctx, req, b.pathConfigRefreshRead), nil
}

// rootConfig is the stored config/root.
type rootConfig struct {
	AccessKey            string   `json:"access_key"`
	SecretKey            string   `json:"secret_key"`
	Region               string   `json:"region"`
	STSEndpoint          string   `json:"sts_endpoint"`
	STSRegion            string   `json:"sts_region"`
	STSFallbackEndpoints []string `json:"sts_fallback_endpoints"`
	STSFallbackRegions   []string `json:"sts_fallback_regions"`
	IAMEndpoint          string   `json:"iam_endpoint,omitempty"`
	// IAMRegion is the region IAM calls are signed for; "" derives it from
	// Region's partition (iamTargetOf).
	IAMRegion string `json:"iam_region,omitempty"`
	// RotationPeriod is the scheduled rotation's period, 0 when off.
	RotationPeriod time.Duration `json:"rotation_period,omitempty"`
	// KeySetAt is when AccessKey was stored (by an operator or a rotation),
	// or when rotation was turned on for a key stored before: the key's age.
	KeySetAt time.Time `json:"key_set_at,omitempty"`
	// KeyRotated: AccessKey was stored by a rotation (at KeySetAt), not
	// written by an operator. For keySwitchGrace after KeySetAt a refusal
	// of it is IAM still propagating it, on whichever node builds the
	// clients: stored, so that a failover or a restart right after a
	// rotation keeps the grace.
	KeyRotated bool `json:"key_rotated,omitempty"`
}

func defaultRootConfig() *rootConfig {
	return &rootConfig{Region: defaultRegion}
}

// validate returns a message for the caller, or "" when cfg is valid.
func (c *rootConfig) validate() string {
	if (c.AccessKey == "") != (c.SecretKey == "") {
		return "access_key and secret_key must be set together (or both left empty to use the default AWS credential chain)"
	}
	if c.AccessKey != "" && !accessKeyRegex.MatchString(c.AccessKey) {
		return "access_key must be 16 to 128 upper-case letters and digits, such as AKIAIOSFODNN7EXAMPLE"
	}
	if strings.ContainsAny(c.SecretKey, " \t\r\n") || len(c.SecretKey) > 256 {
		return "secret_key must be at most 256 characters without whitespace"
	}
	if !regionRegex.MatchString(c.Region) {
		return fmt.Sprintf("region must be an AWS region name such as %s", defaultRegion)
	}
	if c.STSRegion != "" && !regionRegex.MatchString(c.STSRegion) {
		return fmt.Sprintf("sts_region must be an AWS region name such as %s", defaultRegion)
	}
	if c.STSEndpoint != "" {
		if msg := validateEndpoint("sts_endpoint", c.STSEndpoint); msg != "" {
			return msg
		}
	}
	if len(c.STSFallbackEndpoints) > maxFallbackEndpoints {
		return fmt.Sprintf("sts_fallback_endpoints takes at most %d endpoints", maxFallbackEndpoints)
	}
	for _, e := range c.STSFallbackEndpoints {
		if msg := validateEndpoint("sts_fallback_endpoints", e); msg != "" {
			return msg
		}
	}
	if len(c.STSFallbackRegions) != 0 && len(c.STSFallbackRegions) != len(c.STSFallbackEndpoints) {
		return fmt.Sprintf("sts_fallback_regions must have one region per fallback endpoint (%d), or be empty", len(c.STSFallbackEndpoints))
	}
	for _, r := range c.STSFallbackRegions {
		if !regionRegex.MatchString(r) {
			return fmt.Sprintf("sts_fallback_regions must be AWS region names such as %s", defaultRegion)
		}
	}
	if c.IAMEndpoint != "" {
		if msg := validateEndpoint("iam_endpoint", c.IAMEndpoint); msg != "" {
			return msg
		}
	}
	if c.IAMRegion != "" && !regionRegex.MatchString(c.IAMRegion) {
		return fmt.Sprintf("iam_region must be an AWS region name such as us-east-1, us-gov-west-1 or cn-north-1 (or empty to derive it from region); got %q", c.IAMRegion)
	}
	if c.IAMRegion != "" && partitionOf(c.IAMRegion) != partitionOf(c.Region) {
		return fmt.Sprintf("iam_region %s is in partition %s but region %s is in %s: IAM keys of one partition do not work in another; leave iam_region empty to derive it from region",
			c.IAMRegion, partitionOf(c.IAMRegion).name, c.Region, partitionOf(c.Region).name)
	}
	if c.RotationPeriod != 0 && (c.RotationPeriod < minRotationPeriod() || c.RotationPeriod > maxRotationPeriod) {
		return fmt.Sprintf("rotation_period must be 0 (off) or between %s and %s; got %s", minRotationPeriod(), maxRotationPeriod, c.RotationPeriod)
	}
	if c.RotationPeriod != 0 && c.AccessKey == "" {
		return "rotation_period needs a static access_key and secret_key: the default AWS credential chain's keys belong to the environment, and the plugin cannot rotate them"
	}
	return ""
}

var accessKeyRegex = regexp.MustCompile(`^[A-Z0-9]{16,128}$`)

// validateEndpoint allows https anywhere and plain http only on loopback,
// where the traffic never leaves the machine (the emulator, a local proxy).
func validateEndpoint(field, raw string) string {
	u, err := url.Parse(raw)
	if err != nil || u.Host == "" || u.Opaque != "" {
		return fmt.Sprintf("%s must be an absolute URL such as https://sts.us-east-1.amazonaws.com; got %q", field, raw)
	}
	if u.User != nil || u.RawQuery != "" || u.Fragment != "" {
		return fmt.Sprintf("%s must not contain credentials, a query or a fragment", field)
	}
	switch u.Scheme {
	case "https":
	case "http":
		if !isLoopbackHost(u.Hostname()) {
			return fmt.Sprintf("%s must use https; http is allowed only on a loopback address (127.0.0.0/8, ::1, localhost)", field)
		}
	default:
		return fmt.Sprintf("%s must use https (or http on a loopback address); got scheme %q", field, u.Scheme)
	}
	if u.Port() != "" {
		if _, err := net.LookupPort("tcp", u.Port()); err != nil {
			return fmt.Sprintf("%s has an invalid port %q", field, u.Port())
		}
	}
	return ""
}

func isLoopbackHost(host string) bool {
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// refreshConfig is the stored config/refresh.
type refreshConfig struct {
	MaxRetries      int           `json:"max_retries"`
	RetryWindow     time.Duration `json:"retry_window"`
	RefreshFraction float64       `json:"refresh_fraction"`
	STSRateLimit    float64       `json:"sts_rate_limit"`
	STSBurst        int           `json:"sts_burst"`
	// MetricsMaxRoles bounds the roles with per-role metrics series. A
	// config stored before it existed decodes to the default.
	MetricsMaxRoles int `json:"metrics_max_roles"`
	// MaxEntityCredentials caps the mount's entity credentials; 0 for no
	// cap. A config stored before it existed decodes to the default.
	MaxEntityCredentials int `json:"max_entity_credentials"`
}

func defaultRefreshConfig() refreshConfig {
	return refreshConfig{
		MaxRetries:      defaultMaxRetries,
		RetryWindow:     defaultRetryWindow,
		RefreshFraction: defaultRefreshFraction,
		STSRateLimit:    defaultSTSRateLimit,
		STSBurst:        defaultSTSBurst,
		MetricsMaxRoles: defaultMetricsMaxRoles,

		MaxEntityCredentials: defaultMaxEntityCredentials,
	}
}

// block is the length of one retry block.
func (c refreshConfig) block() time.Duration {
	return c.RetryWindow / time.Duration(c.MaxRetries)
}

// shortestMargin is the time between the latest refresh start and expiry of
// the shortest credential STS issues.
func (c refreshConfig) shortestMargin() time.Duration {
	return time.Duration(0.9 * c.RefreshFraction * float64(shortestLifetime)).Truncate(time.Second)
}

// validate returns a message naming the valid range, or "" when c is valid.
func (c refreshConfig) validate() string {
	switch {
	case c.MaxRetries < minMaxRetries || c.MaxRetries > maxMaxRetries:
		return fmt.Sprintf("max_retries must be between %d and %d; got %d", minMaxRetries, maxMaxRetries, c.MaxRetries)
	case c.RetryWindow < minRetryWindow || c.RetryWindow > maxRetryWindow:
		return fmt.Sprintf("retry_window must be between %s and %s; got %s", minRetryWindow, maxRetryWindow, c.RetryWindow)
	case math.IsNaN(c.RefreshFraction) || c.RefreshFraction < minRefreshFraction || c.RefreshFraction > maxRefreshFraction:
		return fmt.Sprintf("refresh_fraction must be between %g and %g; got %g", minRefreshFraction, maxRefreshFraction, c.RefreshFraction)
	case math.IsNaN(c.STSRateLimit) || c.STSRateLimit < 0 || c.STSRateLimit > maxSTSRateLimit:
		return fmt.Sprintf("sts_rate_limit must be between 0 and %g (0 means no cap); got %g", maxSTSRateLimit, c.STSRateLimit)
	case c.MetricsMaxRoles < 0 || c.MetricsMaxRoles > maxMetricsMaxRoles:
		return fmt.Sprintf("metrics_max_roles must be between 0 and %d; got %d", maxMetricsMaxRoles, c.MetricsMaxRoles)
	case c.MaxEntityCredentials < 0 || c.MaxEntityCredentials > maxMaxEntityCredentials:
		return fmt.Sprintf("max_entity_credentials must be between 0 and %d; got %d", maxMaxEntityCredentials, c.MaxEntityCredentials)
	case c.STSBurst < 0 || c.STSBurst > maxSTSBurst:
		return fmt.Sprintf("sts_burst must be between 0 and %d; got %d", maxSTSBurst, c.STSBurst)
	case c.STSRateLimit > 0 && c.STSRateLimit < minSTSRateLimit:
		return fmt.Sprintf("sts_rate_limit must be 0 (no cap) or between %g (one call per 100s) and %g; got %g", minSTSRateLimit, maxSTSRateLimit, c.STSRateLimit)
	case c.STSRateLimit > 0 && c.STSBurst < 1:
		return fmt.Sprintf("sts_burst must be between 1 and %d when sts_rate_limit is set; got %d", maxSTSBurst, c.STSBurst)
	case c.block() < minRetryBlock || c.block() > maxRetryBlock:
		return fmt.Sprintf("retry_window / max_retries (the retry block) must be between %s and %s: at least %s so that an STS call gets a timeout of at least %s, at most %s so that a cold read sees a retry within Vault's 90s request timeout; got %s / %d = %s",
			minRetryBlock, maxRetryBlock, minRetryBlock, callTimeout(minRetryBlock), maxRetryBlock, c.RetryWindow, c.MaxRetries, c.block())
	case c.RetryWindow > c.shortestMargin():
		return fmt.Sprintf("retry_window must be between %s and the refresh margin of the shortest credential STS issues (refresh_fraction × 900s, less the 10%% start delay = %s), or a failing cycle could not finish before it expires; got %s",
			minRetryWindow, c.shortestMargin(), c.RetryWindow)
	}
	return ""
}

func trimAll(in []string) []string {
	out := make([]string, 0, len(in))
	for _, s := range in {
		if s = strings.TrimSpace(s); s != "" {
			out = append(out, s)
		}
	}
	return out
}

func nonNil(s []string) []string {
	if s == nil {
		return []string{}
	}
	return s
}

const pathConfigRootHelpSyn = `Configure how the plugin reaches AWS STS.`

const pathConfigRootHelpDesc = `
The keys the plugin signs STS calls with, and where it sends them.

Without access_key and secret_key, the default AWS credential chain is used
(environment, shared files, web identity, ECS/EC2 instance metadata) through
the AWS SDK's own cached provider.

sts_endpoint overrides the SDK's default endpoint for the region. When a call
to it fails with a retryable error (throttling, 5xx, timeout, connection
error), sts_fallback_endpoints are tried in order within the same attempt,
signed for sts_fallback_regions. An endpoint must use https, except on a
loopback address (127.0.0.0/8, ::1, localhost), where http is allowed.

Root key rotation calls IAM, a global service with one endpoint per AWS
partition, signed for that partition's IAM region: region's partition
decides both (aws: iam.amazonaws.com and us-east-1; aws-us-gov:
iam.us-gov.amazonaws.com and us-gov-west-1; aws-cn:
iam.cn-north-1.amazonaws.com.cn and cn-north-1). iam_region sets the
signing region explicitly (it must be in region's partition), and
iam_endpoint the URL.

A read never returns the secret key; secret_key_set says whether one is stored.
`

const pathConfigRefreshHelpSyn = `Configure the refresh schedule and retry policy.`

const pathConfigRefreshHelpDesc = `
A role's credential is refreshed once its remaining validity falls below
refresh_fraction of its issued lifetime (default 0.33), after a random start
delay of up to 10% of that margin.

A refresh cycle makes up to max_retries attempts (default 6, range 1-20) over
retry_window (default 30s, range 1s-10m): the window is split into equal
blocks (retry_block = retry_window / max_retries, returned by a read) and
attempt i runs at a uniformly random time inside block i. An error that
cannot succeed on retry (AccessDenied, a bad signature, an invalid policy)
ends the cycle at once. A failed cycle never replaces the cached credential;
the next cycle starts after a growing, jittered pause (retry_window, 2x, 4x,
up to 5 minutes) that always leaves room for one more cycle before the
credential expires.

sts_rate_limit (default 10 per second, at least 0.01, or 0 for no cap) and
sts_burst (default 10) cap STS calls across all roles; an attempt waits for
a slot inside its block. A role whose every attempt is refused a slot shows
rate_limited_since in its status. A read before any write returns the
defaults.

metrics_max_roles (default 1000, 0 to 100000) bounds the roles for which
the metrics path exports per-role series (about 0.9 KB of page per role); a
mount with more, or a value of 0, exports aggregates only. A scrape holds a
few copies of its page for some seconds: raising the bound to 10 000 roles
makes every scrape lift the plugin's RSS to 2 to 3.5 times its idle figure.

max_entity_credentials (default 100000, 0 to 10000000, 0 for no cap) bounds
the entity credentials (cache_scope=entity) the mount caches across all
roles, as each role's max_entities bounds its own. A new entity that finds
either full evicts its role's least recently read credential that nobody
has read for entity_idle_ttl; with none, it is refused with a 400.

The fields are checked together, and a write that breaks a rule gets a 400
naming it:
  - the retry block (retry_window / max_retries) is at least 1s, so an STS
    call gets a timeout of at least 800ms (4/5 of a block, at most 10s);
  - the block is at most 45s, so a cold read, which makes its first attempt
    at once and waits at most Vault's 90s request timeout, sees a retry;
  - retry_window fits in the refresh margin of the shortest credential STS
    issues: refresh_fraction × 900s, less the 10% start delay.
`
