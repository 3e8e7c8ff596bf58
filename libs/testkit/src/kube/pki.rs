//! The cluster's certificates, made on the spot: one CA, the API server's serving
//! certificate, a client certificate per component (its user and groups are what RBAC and
//! the Node authorizer see), the service-account signing key, and a kubeconfig per client.

use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};

use crate::process::Error;

/// A client of the API server: the file stem of its certificate and kubeconfig, its user
/// name and its group.
pub(crate) struct Client {
    pub(crate) file: String,
    pub(crate) user: String,
    pub(crate) group: Option<String>,
}

impl Client {
    pub(crate) fn new(file: &str, user: &str, group: Option<&str>) -> Self {
        Self {
            file: file.into(),
            user: user.into(),
            group: group.map(Into::into),
        }
    }
}

/// The certificate folder of a cluster.
pub(crate) struct Pki {
    dir: PathBuf,
}

fn pki_error(what: &str) -> impl FnOnce(rcgen::Error) -> Error + '_ {
    move |e| Error::Command {
        command: format!("make the certificate of {what}"),
        status: "failed".into(),
        stderr: e.to_string(),
    }
}

impl Pki {
    /// Makes the CA, the API server's certificate for `server_names` (names and IPs), a
    /// client certificate for each of `clients`, the service-account key pair, and a
    /// kubeconfig per client pointing at `server` (`https://IP:PORT`).
    pub(crate) fn make(
        dir: &Path,
        server: &str,
        server_names: &[String],
        clients: &[Client],
    ) -> Result<Self, Error> {
        std::fs::create_dir_all(dir).map_err(Error::io(format!("create {}", dir.display())))?;
        let pki = Self { dir: dir.into() };

        let ca_key = KeyPair::generate().map_err(pki_error("the CA"))?;
        let mut ca_params =
            CertificateParams::new(Vec::<String>::new()).map_err(pki_error("the CA"))?;
        ca_params
            .distinguished_name
            .push(DnType::CommonName, "primus-testkit-cluster-ca");
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca_params.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
        ];
        let ca_cert = ca_params
            .self_signed(&ca_key)
            .map_err(pki_error("the CA"))?;
        pki.write("ca.crt", &ca_cert.pem())?;
        pki.write("ca.key", &ca_key.serialize_pem())?;
        let issuer = Issuer::new(ca_params, ca_key);

        pki.leaf(
            &issuer,
            "apiserver",
            "kube-apiserver",
            None,
            server_names,
            true,
        )?;
        for client in clients {
            pki.leaf(
                &issuer,
                &client.file,
                &client.user,
                client.group.as_deref(),
                &[],
                false,
            )?;
            pki.kubeconfig(&client.file, server)?;
        }
        let service_accounts = KeyPair::generate().map_err(pki_error("service accounts"))?;
        pki.write("sa.key", &service_accounts.serialize_pem())?;
        pki.write("sa.pub", &service_accounts.public_key_pem())?;
        Ok(pki)
    }

    /// The folder.
    pub(crate) fn dir(&self) -> &Path {
        &self.dir
    }

    /// The kubeconfig of client `file`.
    pub(crate) fn kubeconfig_path(&self, file: &str) -> PathBuf {
        self.dir.join(format!("{file}.kubeconfig"))
    }

    fn leaf(
        &self,
        issuer: &Issuer<'_, KeyPair>,
        file: &str,
        common_name: &str,
        organization: Option<&str>,
        names: &[String],
        serves: bool,
    ) -> Result<(), Error> {
        let key = KeyPair::generate().map_err(pki_error(file))?;
        let mut params = CertificateParams::new(names.to_vec()).map_err(pki_error(file))?;
        if let Some(organization) = organization {
            params
                .distinguished_name
                .push(DnType::OrganizationName, organization);
        }
        params
            .distinguished_name
            .push(DnType::CommonName, common_name);
        params.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        params.extended_key_usages = if serves {
            vec![
                ExtendedKeyUsagePurpose::ServerAuth,
                ExtendedKeyUsagePurpose::ClientAuth,
            ]
        } else {
            vec![ExtendedKeyUsagePurpose::ClientAuth]
        };
        params.use_authority_key_identifier_extension = true;
        let cert = params.signed_by(&key, issuer).map_err(pki_error(file))?;
        self.write(&format!("{file}.crt"), &cert.pem())?;
        self.write(&format!("{file}.key"), &key.serialize_pem())
    }

    fn kubeconfig(&self, file: &str, server: &str) -> Result<(), Error> {
        let dir = self.dir.display();
        let text = format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: primus-testkit\n  cluster:\n    server: {server}\n    certificate-authority: {dir}/ca.crt\nusers:\n- name: {file}\n  user:\n    client-certificate: {dir}/{file}.crt\n    client-key: {dir}/{file}.key\ncontexts:\n- name: primus-testkit\n  context: {{cluster: primus-testkit, user: {file}}}\ncurrent-context: primus-testkit\n"
        );
        self.write(&format!("{file}.kubeconfig"), &text)
    }

    fn write(&self, file: &str, text: &str) -> Result<(), Error> {
        let path = self.dir.join(file);
        std::fs::write(&path, text).map_err(Error::io(format!("write {}", path.display())))
    }
}
