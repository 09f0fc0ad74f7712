// Apache Flink's own job for bench/keyed_count.py: N (key, value) records
// (key = i % 1000, value = i) from a parallel sequence source, keyBy(key),
// a flatMap counting per key what its subtask receives; parallelism 2 on a
// local MiniCluster of 2 TaskManagers of one slot each, so each subtask's
// records for the other TaskManager cross Netty over loopback.
//
//   java -cp CLASSES:FLINK_LIB/* KeyedCount RECORDS WARMUP
//
// Runs WARMUP jobs (the JIT warms up), prints "ready", then runs one more
// job for each line "run" read from its standard input, until its end, all
// in one JVM, so that a caller can take turns with other measurements.  It
// prints one line per job: "job I warmup|steady RECORDS_PER_S
// CPU_NS_PER_RECORD NET_RUNTIME_MS" (the CPU time of the whole JVM over the
// job, its deployment included).  A job's time runs from the first record
// either counting subtask receives to the last subtask's close (the
// cluster's start and the job's deployment are outside it, as the Python
// rows' set-up is).  Every job's counts are checked: each key counted
// N/1000 times (give or take one), by one subtask only.
import org.apache.flink.api.common.JobExecutionResult;
import org.apache.flink.api.common.functions.OpenContext;
import org.apache.flink.api.common.functions.RichFlatMapFunction;
import org.apache.flink.api.common.typeinfo.Types;
import org.apache.flink.api.java.tuple.Tuple2;
import org.apache.flink.configuration.Configuration;
import org.apache.flink.configuration.TaskManagerOptions;
import org.apache.flink.streaming.api.environment.StreamExecutionEnvironment;
import org.apache.flink.streaming.api.functions.sink.v2.DiscardingSink;
import org.apache.flink.util.Collector;

import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.lang.management.ManagementFactory;

public final class KeyedCount {
    static final int KEYS = 1000;
    static final int PARALLELISM = 2;
    // Per counting subtask: its counts, its first record's and its close's
    // System.nanoTime() (the MiniCluster runs in this JVM).
    static final long[][] COUNTS = new long[PARALLELISM][];
    static final long[] FIRST = new long[PARALLELISM];
    static final long[] CLOSED = new long[PARALLELISM];

    /** Counts the records of its subtask per key in an array. */
    public static final class Count extends RichFlatMapFunction<Tuple2<Long, Long>, Long> {
        private long[] counts;
        private long first;

        @Override
        public void open(OpenContext context) {
            counts = new long[KEYS];
            first = 0;
        }

        @Override
        public void flatMap(Tuple2<Long, Long> record, Collector<Long> out) {
            if (first == 0) {
                first = System.nanoTime();
            }
            counts[(int) (long) record.f0]++;
        }

        @Override
        public void close() {
            int index = getRuntimeContext().getTaskInfo().getIndexOfThisSubtask();
            synchronized (KeyedCount.class) {
                COUNTS[index] = counts;
                FIRST[index] = first;
                CLOSED[index] = System.nanoTime();
            }
        }
    }

    static JobExecutionResult runJob(StreamExecutionEnvironment env, long records) throws Exception {
        synchronized (KeyedCount.class) {
            for (int i = 0; i < PARALLELISM; i++) {
                COUNTS[i] = null;
            }
        }
        env.fromSequence(0, records - 1)
                .map(i -> Tuple2.of(i % KEYS, i))
                .returns(Types.TUPLE(Types.LONG, Types.LONG))
                .keyBy(r -> r.f0, Types.LONG)
                .flatMap(new Count())
                .returns(Types.LONG)
                .sinkTo(new DiscardingSink<>());
        return env.execute("keyed count");
    }

    static void check(long records) {
        long[] total = new long[KEYS];
        for (int s = 0; s < PARALLELISM; s++) {
            if (COUNTS[s] == null) {
                throw new IllegalStateException("subtask " + s + " did not report its counts");
            }
            for (int k = 0; k < KEYS; k++) {
                if (COUNTS[s][k] != 0 && total[k] != 0) {
                    throw new IllegalStateException("key " + k + " counted by two subtasks");
                }
                total[k] += COUNTS[s][k];
            }
        }
        for (int k = 0; k < KEYS; k++) {
            long want = records / KEYS + (k < records % KEYS ? 1 : 0);
            if (total[k] != want) {
                throw new IllegalStateException("key " + k + ": " + total[k] + " records, not " + want);
            }
        }
    }

    public static void main(String[] args) throws Exception {
        long records = Long.parseLong(args[0]);
        int warmup = Integer.parseInt(args[1]);
        Configuration conf = new Configuration();
        conf.set(TaskManagerOptions.NUM_TASK_SLOTS, 1);
        conf.set(TaskManagerOptions.MINI_CLUSTER_NUM_TASK_MANAGERS, PARALLELISM);
        StreamExecutionEnvironment env =
                StreamExecutionEnvironment.createLocalEnvironment(PARALLELISM, conf);
        for (int r = 0; r < warmup; r++) {
            job(env, records, r, "warmup");
        }
        System.out.println("ready");
        System.out.flush();
        BufferedReader in = new BufferedReader(new InputStreamReader(System.in));
        for (int r = warmup; "run".equals(in.readLine()); r++) {
            job(env, records, r, "steady");
        }
    }

    static void job(StreamExecutionEnvironment env, long records, int r, String kind)
            throws Exception {
        com.sun.management.OperatingSystemMXBean os =
                (com.sun.management.OperatingSystemMXBean) ManagementFactory.getOperatingSystemMXBean();
        long cpu = os.getProcessCpuTime();
        JobExecutionResult result = runJob(env, records);
        cpu = os.getProcessCpuTime() - cpu;
        check(records);
        long start = Math.min(FIRST[0], FIRST[1]);
        long end = Math.max(CLOSED[0], CLOSED[1]);
        double rate = records / ((end - start) / 1e9);
        System.out.printf("job %d %s %.0f %.1f %d%n", r, kind, rate, (double) cpu / records,
                result.getNetRuntime());
        System.out.flush();
    }
}
