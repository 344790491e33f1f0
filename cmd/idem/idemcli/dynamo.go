package idemcli

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	awsconfig "github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemdynamo"
	"github.com/idem-go/idem/idemjanitor"
	"github.com/idem-go/idem/idemredis"
)

// The records in DynamoDB: `--keys dynamodb://TABLE?region=…&endpoint=…`
// for serve and inspect, `--db dynamodb://…` for purge and migrate.

const dynamoScheme = "dynamodb://"

// isDynamoURL reports whether a --keys or --db value names a DynamoDB
// table.
func isDynamoURL(s string) bool { return strings.HasPrefix(s, dynamoScheme) }

// dynamoTarget is a parsed dynamodb:// URL.
type dynamoTarget struct {
	table    string
	region   string        // "" takes the AWS configuration's
	endpoint string        // "" is AWS's own
	skew     time.Duration // idemdynamo.Config.MaxClockSkew; 0 is its default
}

const dynamoURLHelp = "dynamodb://TABLE[?region=REGION][&endpoint=http://HOST:PORT][&max-clock-skew=DURATION]"

// parseDynamoURL reads a dynamodb:// value. It only parses.
func parseDynamoURL(raw string) (dynamoTarget, error) {
	u, err := url.Parse(raw)
	if err != nil || u.Scheme != "dynamodb" || u.User != nil {
		return dynamoTarget{}, usagef("%s: want %s", schemeOnly(raw), dynamoURLHelp)
	}
	t := dynamoTarget{table: u.Host}
	if strings.Trim(u.Path, "/") != "" {
		return dynamoTarget{}, usagef("dynamodb:// URL: the table is the host part, with no path; want %s", dynamoURLHelp)
	}
	if !validTableName(t.table) {
		return dynamoTarget{}, usagef("dynamodb:// URL: table name %s: want 3 to 255 of a-z, A-Z, 0-9, '_', '-', '.'", strconv.Quote(t.table))
	}
	query, err := url.ParseQuery(u.RawQuery)
	if err != nil {
		// Not echoed: it may hold a password.
		return dynamoTarget{}, usagef("dynamodb:// URL: the query is malformed (a '%%' not followed by two hex digits?); want %s", dynamoURLHelp)
	}
	for name, values := range query {
		v := values[len(values)-1]
		switch name {
		case "region":
			t.region = v
		case "endpoint":
			e, err := url.Parse(v)
			if err != nil || e.User != nil {
				// Not echoed: it may hold a password.
				return dynamoTarget{}, usagef("dynamodb:// URL: the endpoint is not a URL without credentials; want http://host:port or https://host")
			}
			if (e.Scheme != "http" && e.Scheme != "https") || e.Host == "" {
				return dynamoTarget{}, usagef("dynamodb:// URL: endpoint %s: want http://host:port or https://host", strconv.Quote(v))
			}
			t.endpoint = v
		case "max-clock-skew":
			d, err := time.ParseDuration(v)
			if err != nil || d < 0 {
				return dynamoTarget{}, usagef("dynamodb:// URL: max-clock-skew %s: want a duration such as 1s", strconv.Quote(v))
			}
			t.skew = d
			if d == 0 {
				t.skew = -1 // no margin, said explicitly
			}
		default:
			return dynamoTarget{}, usagef("dynamodb:// URL: unknown parameter %s; want %s", strconv.Quote(name), dynamoURLHelp)
		}
	}
	return t, nil
}

func validTableName(s string) bool {
	if len(s) < 3 || len(s) > 255 {
		return false
	}
	for _, c := range s {
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '_' || c == '-' || c == '.') {
			return false
		}
	}
	return true
}

// describe names the target in logs.
func (t dynamoTarget) describe() string {
	s := dynamoScheme + t.table
	if t.endpoint != "" {
		s += " at " + t.endpoint
	}
	return s
}

// client returns a DynamoDB client for t, configured as the AWS SDK
// configures itself (environment, shared files, instance role). With an
// endpoint and no AWS credentials in the environment, it signs with
// placeholder credentials, which the local servers (dynalite, DynamoDB
// Local) accept.
func (t dynamoTarget) client(ctx context.Context) (*dynamodb.Client, error) {
	var opts []func(*awsconfig.LoadOptions) error
	if t.region != "" {
		opts = append(opts, awsconfig.WithRegion(t.region))
	}
	if t.endpoint != "" && os.Getenv("AWS_ACCESS_KEY_ID") == "" && os.Getenv("AWS_PROFILE") == "" {
		opts = append(opts, awsconfig.WithCredentialsProvider(aws.CredentialsProviderFunc(func(context.Context) (aws.Credentials, error) {
			return aws.Credentials{AccessKeyID: "local", SecretAccessKey: "local", Source: "idem placeholder for a local endpoint"}, nil
		})))
	}
	cfg, err := awsconfig.LoadDefaultConfig(ctx, opts...)
	if err != nil {
		return nil, fmt.Errorf("load the AWS configuration: %w", err)
	}
	if cfg.Region == "" {
		return nil, usagef("dynamodb:// URL: no region; add ?region=… or set AWS_REGION")
	}
	return dynamodb.NewFromConfig(cfg, func(o *dynamodb.Options) {
		if t.endpoint != "" {
			o.BaseEndpoint = aws.String(t.endpoint)
		}
	}), nil
}

// checkKeysURL checks a --keys value: dynamodb:// or redis://.
func checkKeysURL(raw string) error {
	if isDynamoURL(raw) {
		_, err := parseDynamoURL(raw)
		return err
	}
	_, err := parseRedisURL(raw)
	return err
}

// useKeys opens the store a --keys value names. With create, a DynamoDB
// table is created when missing (serve creates its tables at start).
func (c *conn) useKeys(ctx context.Context, raw string, logger *slog.Logger, create bool) (idem.Store, error) {
	if !isDynamoURL(raw) {
		return c.useRedis(ctx, raw, &idemredis.Config{Logger: logger})
	}
	st, _, err := openDynamo(ctx, raw, logger, create)
	return st, err
}

// openDynamo opens the store on a dynamodb:// table, checking that the
// table exists (or creating it, with create).
func openDynamo(ctx context.Context, raw string, logger *slog.Logger, create bool) (*idemdynamo.Store, dynamoTarget, error) {
	t, err := parseDynamoURL(raw)
	if err != nil {
		return nil, t, err
	}
	client, err := t.client(ctx)
	if err != nil {
		return nil, t, err
	}
	if create {
		if _, err := idemdynamo.CreateTable(ctx, client, t.table); err != nil {
			if !errors.Is(err, idemdynamo.ErrNoTTL) {
				return nil, t, fmt.Errorf("cannot create %s: %w", t.describe(), err)
			}
			logger.Warn("DynamoDB TTL could not be turned on; expired records stay until `idem purge` deletes them", slog.String("table", t.table), slog.Any("error", err))
		}
	} else if _, err := client.DescribeTable(ctx, &dynamodb.DescribeTableInput{TableName: aws.String(t.table)}); err != nil {
		return nil, t, fmt.Errorf("cannot reach %s: %w", t.describe(), err)
	}
	st, err := idemdynamo.NewStore(client, &idemdynamo.Config{Table: t.table, MaxClockSkew: t.skew})
	return st, t, err
}

// purgeDynamo is Purge on a dynamodb:// --db.
func (c *Purge) purgeDynamo(ctx context.Context, opts *PurgeOpts) error {
	store, _, err := openDynamo(ctx, opts.DB, c.logger(), false)
	if err != nil {
		return err
	}
	j, err := idemjanitor.NewJanitor(store, &idemjanitor.Config{BatchSize: opts.Batch, Logger: c.logger()})
	if err != nil {
		return err
	}
	n, err := j.PurgeOnce(ctx)
	if err != nil {
		return fmt.Errorf("purge (%d records deleted before the failure): %w", n, err)
	}
	_, err = fmt.Fprintf(c.stdout(), "purged %d expired records\n", n)
	return err
}

// migrateDynamo is Migrate on a dynamodb:// --db: the table is created
// (idemdynamo.CreateTable) when missing.
func (c *Migrate) migrateDynamo(ctx context.Context, opts *MigrateOpts) error {
	t, err := parseDynamoURL(opts.DB)
	if err != nil {
		return err
	}
	client, err := t.client(ctx)
	if err != nil {
		return err
	}
	step := "create DynamoDB table " + t.table + " (key pk, TTL on ttl)"
	if opts.DryRun {
		_, err := client.DescribeTable(ctx, &dynamodb.DescribeTableInput{TableName: aws.String(t.table)})
		var missing *types.ResourceNotFoundException
		switch {
		case errors.As(err, &missing):
			return printMigrations(c.stdout(), []string{step}, "pending: ")
		case err != nil:
			return fmt.Errorf("cannot reach %s: %w", t.describe(), err)
		}
		return printMigrations(c.stdout(), nil, "")
	}
	created, err := idemdynamo.CreateTable(ctx, client, t.table)
	if errors.Is(err, idemdynamo.ErrNoTTL) {
		c.logger().Warn("DynamoDB TTL could not be turned on; expired records stay until `idem purge` deletes them", slog.String("table", t.table), slog.Any("error", err))
		err = nil
	}
	if err != nil {
		return fmt.Errorf("migrate %s: %w", t.describe(), err)
	}
	if !created {
		return printMigrations(c.stdout(), nil, "")
	}
	return printMigrations(c.stdout(), []string{step}, "applied: ")
}
