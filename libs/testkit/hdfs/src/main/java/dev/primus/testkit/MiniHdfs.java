package dev.primus.testkit;

import java.io.BufferedReader;
import java.io.File;
import java.io.IOException;
import java.io.InputStreamReader;
import java.nio.charset.StandardCharsets;
import java.util.HashMap;
import java.util.Map;

import org.apache.hadoop.conf.Configuration;
import org.apache.hadoop.fs.Path;
import org.apache.hadoop.fs.permission.FsPermission;
import org.apache.hadoop.hdfs.DistributedFileSystem;
import org.apache.hadoop.hdfs.HdfsConfiguration;
import org.apache.hadoop.hdfs.MiniDFSCluster;
import org.apache.hadoop.hdfs.protocol.HdfsConstants;
import org.apache.hadoop.minikdc.MiniKdc;
import org.apache.hadoop.security.SecurityUtil;
import org.apache.hadoop.security.UserGroupInformation;

import sun.misc.Signal;

/**
 * A real HDFS on loopback for the tests: a namenode and datanodes (MiniDFSCluster, the same
 * namenode and datanode code a Hadoop cluster runs), permissions on.
 *
 * <p>With {@code --kerberos=<client principal>} the cluster is secured as a production one
 * is over RPC: a KDC on loopback (MiniKdc), the namenode and datanodes authenticating with a
 * keytab, block access tokens and SASL on data transfer (the web endpoints stay plain HTTP);
 * the client principal's keytab is written to {@code <base>/client.keytab} and the KDC's
 * {@code krb5.conf} beside it.
 *
 * <p>It prints {@code ready <namenode port> [<realm>]} once every datanode has registered,
 * then reads one command per line on stdin and answers each with {@code ok} or
 * {@code error <why>}:
 * {@code stop-datanode <i>}, {@code start-datanode <i>}, {@code stop-namenode},
 * {@code start-namenode}, {@code mkdir <path> <owner> <octal mode>},
 * {@code quota <path> <bytes>} and {@code clear-quota <path>}. It shuts the cluster down and
 * deletes its folder on SIGTERM and when stdin closes (the process that started it is gone).
 */
public final class MiniHdfs {
    private final MiniDFSCluster cluster;
    private final File base;
    private final Map<Integer, MiniDFSCluster.DataNodeProperties> stopped = new HashMap<>();

    private MiniHdfs(MiniDFSCluster cluster, File base) {
        this.cluster = cluster;
        this.base = base;
    }

    public static void main(String[] args) throws Exception {
        Map<String, String> flags = parse(args);
        File base = new File(required(flags, "base"));
        int namenodePort = Integer.parseInt(required(flags, "namenode-port"));
        int datanodes = Integer.parseInt(flags.getOrDefault("datanodes", "2"));

        Configuration conf = new HdfsConfiguration();
        String kerberosClient = flags.get("kerberos");
        String realm = kerberosClient == null ? null : secure(conf, base, kerberosClient);
        conf.set(MiniDFSCluster.HDFS_MINIDFS_BASEDIR, base.getAbsolutePath());
        conf.setInt("dfs.replication", Math.min(2, datanodes));
        conf.setBoolean("dfs.permissions.enabled", true);
        // A stopped datanode counts as dead after 2 * recheck + 10 * heartbeat = 16 s
        // instead of about 10 minutes, so writes stop choosing it.
        conf.setInt("dfs.namenode.heartbeat.recheck-interval", 3000);
        conf.setLong("dfs.heartbeat.interval", 1);
        conf.setLong("dfs.namenode.stale.datanode.interval", 6000);
        conf.setInt("dfs.namenode.safemode.extension", 0);
        MiniDFSCluster cluster = new MiniDFSCluster.Builder(conf)
                .nameNodePort(namenodePort)
                .numDataNodes(datanodes)
                .format(true)
                .build();
        cluster.waitActive();
        MiniHdfs hdfs = new MiniHdfs(cluster, base);
        Signal.handle(new Signal("TERM"), signal -> hdfs.stop(0));
        Signal.handle(new Signal("INT"), signal -> hdfs.stop(0));
        System.out.println(
                "ready " + cluster.getNameNodePort() + (realm == null ? "" : " " + realm));
        System.out.flush();
        hdfs.serve();
    }

    /**
     * Starts a KDC under {@code base}, makes the service and client principals and sets
     * {@code conf} up for a secured cluster; logs this process in as the cluster's
     * superuser. Returns the realm.
     */
    private static String secure(Configuration conf, File base, String clientPrincipal)
            throws Exception {
        File kdcDir = new File(base, "kdc");
        kdcDir.mkdirs();
        MiniKdc kdc = new MiniKdc(MiniKdc.createConf(), kdcDir);
        kdc.start();
        String realm = kdc.getRealm();
        File serviceKeytab = new File(base, "hdfs.keytab");
        kdc.createPrincipal(serviceKeytab, "hdfs/localhost", "HTTP/localhost");
        kdc.createPrincipal(new File(base, "client.keytab"), clientPrincipal);
        java.nio.file.Files.copy(
                kdc.getKrb5conf().toPath(), new File(base, "krb5.conf").toPath(),
                java.nio.file.StandardCopyOption.REPLACE_EXISTING);

        String service = "hdfs/localhost@" + realm;
        SecurityUtil.setAuthenticationMethod(
                UserGroupInformation.AuthenticationMethod.KERBEROS, conf);
        conf.set("dfs.namenode.kerberos.principal", service);
        conf.set("dfs.namenode.keytab.file", serviceKeytab.getAbsolutePath());
        conf.set("dfs.datanode.kerberos.principal", service);
        conf.set("dfs.datanode.keytab.file", serviceKeytab.getAbsolutePath());
        conf.set("dfs.web.authentication.kerberos.principal", "HTTP/localhost@" + realm);
        conf.setBoolean("dfs.block.access.token.enable", true);
        conf.set("dfs.data.transfer.protection", "authentication");
        // A production datanode needs HTTPS (or privileged ports) besides SASL on data
        // transfer; the web endpoints are not what the tests exercise.
        conf.setBoolean("ignore.secure.ports.for.testing", true);
        UserGroupInformation.setConfiguration(conf);
        UserGroupInformation.loginUserFromKeytab(service, serviceKeytab.getAbsolutePath());
        return realm;
    }

    private void serve() {
        BufferedReader commands =
                new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
        try {
            String line;
            while ((line = commands.readLine()) != null) {
                String answer;
                try {
                    answer = run(line.trim().split("\\s+"));
                } catch (Exception e) {
                    answer = "error " + e.toString().replace('\n', ' ');
                }
                System.out.println(answer);
                System.out.flush();
            }
        } catch (IOException e) {
            System.err.println("reading commands: " + e);
        }
        stop(0);
    }

    private String run(String[] command) throws Exception {
        switch (command[0]) {
            case "stop-datanode": {
                int index = Integer.parseInt(command[1]);
                MiniDFSCluster.DataNodeProperties properties = cluster.stopDataNode(index);
                if (properties == null) {
                    return "error no datanode " + index;
                }
                stopped.put(index, properties);
                return "ok";
            }
            case "start-datanode": {
                int index = Integer.parseInt(command[1]);
                MiniDFSCluster.DataNodeProperties properties = stopped.remove(index);
                if (properties == null) {
                    return "error datanode " + index + " is not stopped";
                }
                cluster.restartDataNode(properties, true);
                cluster.waitActive();
                return "ok";
            }
            case "stop-namenode":
                cluster.shutdownNameNode(0);
                return "ok";
            case "start-namenode":
                cluster.restartNameNode(0, true);
                return "ok";
            case "mkdir": {
                DistributedFileSystem fs = cluster.getFileSystem();
                Path path = new Path(command[1]);
                fs.mkdirs(path);
                fs.setOwner(path, command[2], null);
                fs.setPermission(path, new FsPermission(Short.parseShort(command[3], 8)));
                return "ok";
            }
            case "quota":
                cluster.getFileSystem().setQuota(
                        new Path(command[1]),
                        HdfsConstants.QUOTA_DONT_SET,
                        Long.parseLong(command[2]));
                return "ok";
            case "clear-quota":
                cluster.getFileSystem().setQuota(
                        new Path(command[1]),
                        HdfsConstants.QUOTA_DONT_SET,
                        HdfsConstants.QUOTA_RESET);
                return "ok";
            default:
                return "error unknown command " + command[0];
        }
    }

    private synchronized void stop(int status) {
        try {
            cluster.shutdown(true);
        } catch (Exception e) {
            System.err.println("shutting down: " + e);
        }
        deleteTree(base);
        Runtime.getRuntime().halt(status);
    }

    private static void deleteTree(File file) {
        File[] children = file.listFiles();
        if (children != null) {
            for (File child : children) {
                deleteTree(child);
            }
        }
        file.delete();
    }

    private static Map<String, String> parse(String[] args) {
        Map<String, String> flags = new HashMap<>();
        for (String arg : args) {
            if (!arg.startsWith("--") || !arg.contains("=")) {
                throw new IllegalArgumentException("expected --name=value, got " + arg);
            }
            int eq = arg.indexOf('=');
            flags.put(arg.substring(2, eq), arg.substring(eq + 1));
        }
        return flags;
    }

    private static String required(Map<String, String> flags, String name) {
        String value = flags.get(name);
        if (value == null) {
            throw new IllegalArgumentException("missing --" + name + "=...");
        }
        return value;
    }
}
