// Command orderconsumer turns order.created messages into order rows,
// exactly once per message, with ideminbox: from NATS JetStream or
// RabbitMQ, into SQLite or PostgreSQL. See README.md for the commands.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/ideminbox"
	"github.com/idem-go/idem/ideminbox/idemamqp"
	"github.com/idem-go/idem/ideminbox/idemjetstream"
	"github.com/idem-go/idem/idemjanitor"
	"github.com/idem-go/idem/idemmigrate"
	"github.com/idem-go/idem/idempg"
	"github.com/idem-go/idem/idemsql"
	"github.com/idem-go/idem/idemsql/idemsqlite"
)

// Names on the brokers.
const (
	subject  = "order.created"
	stream   = "ORDERS"
	consumer = "order-projector" // the inbox keeps its keys under ideminbox.Tenant(consumer)
	queue    = "order-projector.order.created"
)

// Order is the payload of an order.created message.
type Order struct {
	OrderID    string `json:"order_id"`
	Customer   string `json:"customer"`
	TotalCents int64  `json:"total_cents"`
}

type options struct {
	broker     string
	natsURL    string
	amqpURL    string
	db         string
	publish    int
	copies     int
	bad        bool
	crashAfter int64
	cleanup    bool
}

func main() {
	var o options
	flag.StringVar(&o.broker, "broker", "nats", "nats or amqp")
	flag.StringVar(&o.natsURL, "nats", "nats://127.0.0.1:4222", "NATS URL")
	flag.StringVar(&o.amqpURL, "amqp", "amqp://guest:guest@127.0.0.1:5672/", "RabbitMQ URL")
	flag.StringVar(&o.db, "db", "orders.db", "SQLite file, or a postgres:// URL")
	flag.IntVar(&o.publish, "publish", 0, "publish this many orders and exit, instead of consuming")
	flag.IntVar(&o.copies, "copies", 2, "with -publish: send each order this many times (same message id)")
	flag.BoolVar(&o.bad, "bad", false, "with -publish: add one malformed order, which ends as poison")
	flag.Int64Var(&o.crashAfter, "crash-after", 0, "exit after this many commits, before acknowledging the last one")
	flag.BoolVar(&o.cleanup, "cleanup", false, "delete the stream or queue of -broker and exit")
	flag.Parse()

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	var err error
	switch {
	case o.cleanup:
		err = cleanup(ctx, o)
	case o.publish > 0:
		err = publish(ctx, o)
	default:
		err = consume(ctx, o)
	}
	if err != nil {
		log.Fatal(err)
	}
}

// database is the store and the two writes the consumer makes through the
// store's transaction.
type database struct {
	store      idem.Store
	insert     func(ctx context.Context, o Order) error
	deadLetter func(ctx context.Context, id, cause string, payload []byte) error
	count      func(ctx context.Context) (int, error)
	close      func()
}

const (
	ordersTable = `CREATE TABLE IF NOT EXISTS orders (
	order_id    TEXT PRIMARY KEY,
	customer    TEXT NOT NULL,
	total_cents BIGINT NOT NULL)`
	deadLettersTable = `CREATE TABLE IF NOT EXISTS order_dead_letters (
	message_id TEXT PRIMARY KEY,
	error      TEXT NOT NULL,
	payload    TEXT NOT NULL)`
)

func openDatabase(ctx context.Context, dsn string) (*database, error) {
	if strings.HasPrefix(dsn, "postgres://") || strings.HasPrefix(dsn, "postgresql://") {
		pool, err := pgxpool.New(ctx, dsn)
		if err != nil {
			return nil, err
		}
		if err := idempg.Migrate(ctx, pool); err != nil {
			return nil, err
		}
		for _, q := range []string{ordersTable, deadLettersTable} {
			if _, err := pool.Exec(ctx, q); err != nil {
				return nil, err
			}
		}
		store, err := idempg.NewStore(pool, nil)
		if err != nil {
			return nil, err
		}
		return &database{
			store: store,
			insert: func(ctx context.Context, o Order) error {
				_, err := idempg.TxFromContext(ctx).Exec(ctx, `INSERT INTO orders (order_id, customer, total_cents) VALUES ($1, $2, $3)`,
					o.OrderID, o.Customer, o.TotalCents)
				return err
			},
			deadLetter: func(ctx context.Context, id, cause string, payload []byte) error {
				_, err := idempg.TxFromContext(ctx).Exec(ctx, `INSERT INTO order_dead_letters (message_id, error, payload) VALUES ($1, $2, $3)`,
					id, cause, string(payload))
				return err
			},
			count: func(ctx context.Context) (n int, err error) {
				err = pool.QueryRow(ctx, `SELECT count(*) FROM orders`).Scan(&n)
				return n, err
			},
			close: pool.Close,
		}, nil
	}
	db, err := idemsqlite.Open(dsn)
	if err != nil {
		return nil, err
	}
	if err := idemmigrate.Migrate(ctx, db, idemmigrate.SQLite); err != nil {
		return nil, err
	}
	for _, q := range []string{ordersTable, deadLettersTable} {
		if _, err := db.ExecContext(ctx, q); err != nil {
			return nil, err
		}
	}
	store, err := idemsql.NewStore(db, idemsql.SQLite)
	if err != nil {
		return nil, err
	}
	return &database{
		store: store,
		insert: func(ctx context.Context, o Order) error {
			_, err := idemsql.TxFromContext(ctx).ExecContext(ctx, `INSERT INTO orders (order_id, customer, total_cents) VALUES (?, ?, ?)`,
				o.OrderID, o.Customer, o.TotalCents)
			return err
		},
		deadLetter: func(ctx context.Context, id, cause string, payload []byte) error {
			_, err := idemsql.TxFromContext(ctx).ExecContext(ctx, `INSERT INTO order_dead_letters (message_id, error, payload) VALUES (?, ?, ?)`,
				id, cause, string(payload))
			return err
		},
		count: func(ctx context.Context) (n int, err error) {
			err = db.QueryRowContext(ctx, `SELECT count(*) FROM orders`).Scan(&n)
			return n, err
		},
		close: func() { _ = db.Close() },
	}, nil
}

// project is the business logic: one order row per message, written
// through the store's transaction so that it commits with the dedup record.
func (d *database) project(ctx context.Context, data []byte) error {
	var o Order
	if err := json.Unmarshal(data, &o); err != nil {
		return fmt.Errorf("malformed order: %w", err)
	}
	if o.OrderID == "" {
		return errors.New("malformed order: no order_id")
	}
	return d.insert(ctx, o)
}

func consume(ctx context.Context, o options) error {
	d, err := openDatabase(ctx, o.db)
	if err != nil {
		return err
	}
	defer d.close()
	logger := slog.New(slog.NewTextHandler(os.Stderr, nil))
	engine, err := idem.NewEngine(d.store, &idem.Config{Logger: logger})
	if err != nil {
		return err
	}
	inbox, err := ideminbox.NewInbox(engine, &ideminbox.Config{
		Consumer:    consumer,
		MaxAttempts: 3,
		// Keep the demo brisk: retry a failed order after 500ms, 1s, 2s…
		RetryDelayFunc: func(attempt int) time.Duration { return 500 * time.Millisecond << (attempt - 1) },
		InFlightDelay:  time.Second,
		DeadLetterFunc: func(ctx context.Context, msg ideminbox.Message, cause error) error {
			return d.deadLetter(ctx, msg.ID, cause.Error(), msg.Data)
		},
		Logger: logger,
	})
	if err != nil {
		return err
	}
	defer inbox.Close(context.WithoutCancel(ctx))
	// Consumer keys are purged after their retention (7 days by default),
	// like HTTP keys.
	janitor, err := idemjanitor.NewJanitor(d.store, &idemjanitor.Config{Logger: logger})
	if err != nil {
		return err
	}
	go func() { _ = janitor.Run(ctx) }()

	var commits atomic.Int64
	observe := func(id string, dec ideminbox.Decision, err error) {
		line := fmt.Sprintf("message %s: %s", id, dec.Action)
		if err != nil {
			line += fmt.Sprintf(" (%v)", err)
		}
		fmt.Println(line)
		if dec.Action == ideminbox.Ack && o.crashAfter > 0 && commits.Add(1) >= o.crashAfter {
			// Committed, not acknowledged: the broker will deliver it again.
			fmt.Println("crashing between commit and ack")
			os.Exit(3)
		}
	}
	defer func() {
		if n, err := d.count(context.WithoutCancel(ctx)); err == nil {
			fmt.Printf("orders in the database: %d\n", n)
		}
	}()

	switch o.broker {
	case "nats":
		nc, err := nats.Connect(o.natsURL)
		if err != nil {
			return err
		}
		defer nc.Close()
		cons, err := natsConsumer(ctx, nc)
		if err != nil {
			return err
		}
		c, err := idemjetstream.NewConsumer(inbox, func(ctx context.Context, msg jetstream.Msg) error {
			return d.project(ctx, msg.Data())
		}, &idemjetstream.Config{ObserveFunc: func(msg jetstream.Msg, dec ideminbox.Decision, err error) {
			id, _ := idemjetstream.DefaultKey(msg)
			observe(id, dec, err)
		}})
		if err != nil {
			return err
		}
		fmt.Println("consuming", subject, "from JetStream stream", stream, "(Ctrl-C to stop)")
		return c.Consume(ctx, cons)
	case "amqp":
		conn, err := amqp.Dial(o.amqpURL)
		if err != nil {
			return err
		}
		defer conn.Close()
		ch, err := amqpChannel(conn)
		if err != nil {
			return err
		}
		if err := ch.Qos(8, 0, false); err != nil {
			return err
		}
		c, err := idemamqp.NewConsumer(inbox, func(ctx context.Context, dl amqp.Delivery) error {
			return d.project(ctx, dl.Body)
		}, &idemamqp.Config{ObserveFunc: func(dl amqp.Delivery, dec ideminbox.Decision, err error) {
			observe(dl.MessageId, dec, err)
		}})
		if err != nil {
			return err
		}
		fmt.Println("consuming", subject, "from RabbitMQ queue", queue, "(Ctrl-C to stop)")
		// Manual acknowledgements: with autoAck a failed order would be lost.
		return c.ConsumeQueue(ctx, ch, queue, consumer)
	}
	return fmt.Errorf("unknown broker %q (want nats or amqp)", o.broker)
}

// natsConsumer creates (or updates) the stream and the durable consumer.
// MaxDeliver -1 leaves the poison decision to the inbox.
func natsConsumer(ctx context.Context, nc *nats.Conn) (jetstream.Consumer, error) {
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, err
	}
	s, err := js.CreateOrUpdateStream(ctx, jetstream.StreamConfig{Name: stream, Subjects: []string{subject}})
	if err != nil {
		return nil, err
	}
	return s.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{
		Durable:    consumer,
		AckPolicy:  jetstream.AckExplicitPolicy,
		AckWait:    10 * time.Second,
		MaxDeliver: -1,
	})
}

// amqpChannel opens a channel and declares the quorum queue: quorum
// queues count deliveries (x-delivery-count), which the inbox uses to
// recognise poison messages across instances and crashes.
func amqpChannel(conn *amqp.Connection) (*amqp.Channel, error) {
	ch, err := conn.Channel()
	if err != nil {
		return nil, err
	}
	_, err = ch.QueueDeclare(queue, true, false, false, false, amqp.Table{"x-queue-type": "quorum"})
	return ch, err
}

func publish(ctx context.Context, o options) error {
	type message struct {
		id   string
		body []byte
	}
	var msgs []message
	for c := 0; c < o.copies; c++ {
		for i := 1; i <= o.publish; i++ {
			order := Order{OrderID: fmt.Sprintf("o-%d", i), Customer: fmt.Sprintf("customer-%d", i), TotalCents: int64(1000 * i)}
			body, _ := json.Marshal(order)
			msgs = append(msgs, message{id: order.OrderID, body: body})
		}
		if o.bad {
			msgs = append(msgs, message{id: "o-bad", body: []byte(`{"order_id": 42`)})
		}
	}
	switch o.broker {
	case "nats":
		nc, err := nats.Connect(o.natsURL)
		if err != nil {
			return err
		}
		defer nc.Close()
		if _, err := natsConsumer(ctx, nc); err != nil {
			return err
		}
		js, _ := jetstream.New(nc)
		stored := 0
		for _, m := range msgs {
			ack, err := js.Publish(ctx, subject, m.body, jetstream.WithMsgID(m.id))
			if err != nil {
				return err
			}
			if !ack.Duplicate {
				stored++
			}
		}
		fmt.Printf("published %d messages; JetStream stored %d (it drops copies of a Nats-Msg-Id within its 2-minute window)\n", len(msgs), stored)
	case "amqp":
		conn, err := amqp.Dial(o.amqpURL)
		if err != nil {
			return err
		}
		defer conn.Close()
		ch, err := amqpChannel(conn)
		if err != nil {
			return err
		}
		for _, m := range msgs {
			if err := ch.PublishWithContext(ctx, "", queue, false, false, amqp.Publishing{
				MessageId: m.id, ContentType: "application/json", DeliveryMode: amqp.Persistent, Body: m.body,
			}); err != nil {
				return err
			}
		}
		fmt.Printf("published %d messages to queue %s\n", len(msgs), queue)
	default:
		return fmt.Errorf("unknown broker %q (want nats or amqp)", o.broker)
	}
	return nil
}

// cleanup deletes what the example created on the broker.
func cleanup(ctx context.Context, o options) error {
	switch o.broker {
	case "nats":
		nc, err := nats.Connect(o.natsURL)
		if err != nil {
			return err
		}
		defer nc.Close()
		js, err := jetstream.New(nc)
		if err != nil {
			return err
		}
		if err := js.DeleteStream(ctx, stream); err != nil && !errors.Is(err, jetstream.ErrStreamNotFound) {
			return err
		}
		fmt.Println("deleted stream", stream)
	case "amqp":
		conn, err := amqp.Dial(o.amqpURL)
		if err != nil {
			return err
		}
		defer conn.Close()
		ch, err := conn.Channel()
		if err != nil {
			return err
		}
		if _, err := ch.QueueDelete(queue, false, false, false); err != nil {
			return err
		}
		fmt.Println("deleted queue", queue)
	default:
		return fmt.Errorf("unknown broker %q (want nats or amqp)", o.broker)
	}
	return nil
}
